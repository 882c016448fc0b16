"""Capacity planning: the cheapest GPU type x TP degree (and replica count) that serves a
workload at a target rate within latency SLOs.

For each candidate (GPU, TP):
1. probe simulations of ONE replica at a per-replica rate r: the workload rescaled to mean
   rate r (`workload.target_rate`), `requests` requests per probe, one probe per seed. For a
   trace, seed k replays the k-th consecutive window of `requests` requests (a replay is
   deterministic, so windows are what varies); synthetic workloads are redrawn per seed;
2. r is sustainable when EVERY seed meets the SLO: p99 TTFT <= ttft_p99_s, p99 TPOT <=
   tpot_p99_s, no request rejected, and (if set) a share >= min_goodput_share of requests
   meeting both targets individually; and the probe reached a steady state: its arrivals span
   >= STEADY_LATENCIES x its mean E2E latency (Little's law: a queue that grows shows only
   after the running batch has turned over a few times; a burst of `requests` at a rate far
   past capacity fits in one batch and meets any SLO). A probe that met the SLO over a shorter
   span is run again with requests = STEADY_LATENCIES x rate x latency x 1.25 (at most
   `max_requests`); one that cannot reach it within max_requests misses, with the reason;
3. search: r = target / 8 (at least r_min), x4 while sustainable (up to the target rate),
   / 4 while not (down to r_min), then geometric bisection until hi / lo <= 1 + rel_tol.
   max rate = the highest sustainable r (0: infeasible, with the reason: the model does not
   fit, or even r_min misses the SLO);
4. replicas = ceil(target / max rate); cost $/h = replicas x TP x price ($/GPU-hour from the
   GPU profile, or --price); $ per million output tokens = $/h / (target x mean output
   tokens x 3600) x 1e6. Candidates are ranked by $/h (infeasible last). Each row also carries
   the replica's memory plan (MEMORY_COLUMNS: weights and KV cache per GPU, KV tokens, max
   concurrency), empty where the model does not fit.
Then the ranking is confirmed by cluster simulations at the target rate (least_outstanding
router): for a candidate, start from its replica count, add replicas while the SLO is
missed, remove while one fewer still meets it (reporting N and N - 1); candidates are
confirmed in rank order until the next one's estimated cost exceeds the cheapest confirmed
cost, and the winner is the cheapest confirmed. A cluster run meets the steady-state rule of
step 2 too (its requests raised up to max_requests); a fleet of more than
MAX_CONFIRM_REPLICAS replicas, or a target rate no cluster run of max_requests can hold for
long enough, is left unconfirmed, with the reason.
Every simulation is a sweep task (simulator/analysis/sweep.py): cached by config hash, parallel,
identical on any backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.analysis.sweep import Task, execute, task_id
from simulator.config.schema import from_dict
from simulator.errors import ConfigError
from simulator.hardware.gpus import get_gpu

SLO_FIELDS = ("ttft_p99_s", "tpot_p99_s", "min_goodput_share")
STEADY_LATENCIES = 3.0  # a probe's arrivals span at least this many mean E2E latencies (step 2)
MAX_CONFIRM_REPLICAS = 64  # larger fleets are not cluster-simulated (~5 MB of state a replica)


@dataclass(frozen=True)
class PlanSlo:
    ttft_p99_s: float | None = 2.0
    tpot_p99_s: float | None = 0.1
    min_goodput_share: float | None = None  # share of requests meeting both targets

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "tpot_p99_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"--slo {name} must be a number of seconds > 0, got {v!r}")
        g = self.min_goodput_share
        if g is not None and not (isinstance(g, (int, float)) and 0 < g <= 1):
            raise ConfigError(f"--slo min_goodput_share must be in (0, 1], got {g!r}")
        if self.ttft_p99_s is None and self.tpot_p99_s is None and g is None:
            raise ConfigError("--slo: set at least one of ttft_p99_s, tpot_p99_s, min_goodput_share")

    def check(self, metrics: dict[str, Any]) -> str:
        """'' when a run meets the SLO, else why not."""
        if metrics.get("requests.rejected"):
            return f"{int(metrics['requests.rejected'])} requests rejected"
        ttft, tpot = metrics.get("latency_s.ttft.p99"), metrics.get("latency_s.tpot.p99")
        if self.ttft_p99_s is not None and (ttft is None or ttft > self.ttft_p99_s):
            return f"p99 TTFT {_ms(ttft)} > {_ms(self.ttft_p99_s)}"
        if self.tpot_p99_s is not None and tpot is not None and tpot > self.tpot_p99_s:
            return f"p99 TPOT {_ms(tpot)} > {_ms(self.tpot_p99_s)}"
        share = metrics.get("slo.share")
        if self.min_goodput_share is not None and (share is None or share < self.min_goodput_share):
            return f"goodput share {share:.3f} < {self.min_goodput_share}"
        return ""


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    ms = x * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


# what one replica's memory plan gives (None where the model does not fit)
MEMORY_COLUMNS = ("weights_gib_per_gpu", "kv_cache_gib_per_gpu", "kv_tokens_per_replica", "max_concurrency")


def replica_memory(setup: Any) -> dict[str, float]:
    """MEMORY_COLUMNS of one replica from its engine Setup: weights on the fullest GPU, the KV
    cache budget per GPU, vLLM's "GPU KV cache size" in tokens and its maximum concurrency at
    max_model_len."""
    from simulator.hardware.gpus import GIB

    m, max_len = setup.memory, setup.engine.max_model_len
    tokens = m.capacity_tokens if m.capacity_tokens is not None else m.max_tokens
    concurrency = m.max_concurrency if m.max_concurrency is not None else m.max_tokens / max_len
    return {"weights_gib_per_gpu": m.weights_bytes / GIB, "kv_cache_gib_per_gpu": m.kv_budget_bytes / GIB,
            "kv_tokens_per_replica": int(tokens),
            "max_concurrency": float(concurrency)}


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tp: int

    @property
    def name(self) -> str:
        return f"{self.gpu} x{self.tp}"


def parse_candidates(gpus: list[str], tps: list[int], pairs: list[str] | None = None) -> list[Candidate]:
    """GPU names x TP degrees, or explicit 'gpu:tp' pairs; names are checked here."""
    out = []
    if pairs:
        for p in pairs:
            gpu, _, tp = p.partition(":")
            if not tp.isdigit() or int(tp) < 1:
                raise ConfigError(f"--candidate {p!r}: expected gpu:tp, e.g. h100-sxm:2")
            out.append(Candidate(gpu, int(tp)))
    else:
        out = [Candidate(g, t) for g in gpus for t in tps]
    if not out:
        raise ConfigError("no candidates: give --gpus and --tp, or --candidate gpu:tp")
    for c in out:
        get_gpu(c.gpu)  # an unknown name is a ConfigError with a suggestion
        if c.tp < 1:
            raise ConfigError(f"tensor parallel degree must be >= 1, got {c.tp}")
    return list(dict.fromkeys(out))


@dataclass
class PlanSettings:
    target_rate: float
    slo: PlanSlo
    seeds: int = 2
    requests: int = 400  # per probe simulation
    cluster_requests: int = 1500  # in the confirming cluster simulation
    max_requests: int = 20_000  # a probe or cluster run raised for a steady state (step 2)
    r_min: float = 0.25  # req/s: below this a candidate is called infeasible
    rel_tol: float = 0.1
    prices: dict[str, float] = field(default_factory=dict)  # gpu name -> $/GPU-hour
    workers: int = 1
    backend: str = "local"
    address: str | None = None
    router: str = "least_outstanding"


class Planner:
    def __init__(self, base: dict[str, Any], settings: PlanSettings, out_dir: Path,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.base = base
        self.s = settings
        self.out = out_dir
        self.log = log
        self.probes: list[dict[str, Any]] = []
        self.candidates: list[Candidate] = []
        r = settings.target_rate
        if isinstance(r, bool) or not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ConfigError(f"--rate must be a finite number of req/s > 0, got {r!r}")
        cfg = from_dict(base)
        self.is_trace = cfg.workload.trace is not None
        self._offsets = self._window_offsets(cfg)
        self.mean_output_tokens = self._mean_output(cfg)

    # --- workload windows -------------------------------------------------------------------
    def _window_offsets(self, cfg) -> list[float]:
        """Trace time at which seed k's window starts (traces only)."""
        if not self.is_trace:
            return []
        from simulator.workload.load import generate
        w = generate(cfg.workload, np.random.SeedSequence(0))
        n = max(self.s.requests, self.s.cluster_requests)
        starts = []
        for k in range(self.s.seeds):
            i = k * self.s.requests
            if i + self.s.requests > len(w):
                raise ConfigError(f"the trace has {len(w)} requests: too few for {self.s.seeds} "
                                  f"windows of {self.s.requests} (lower --seeds or --requests)")
            starts.append(float(cfg.workload.window_start_s + w.arrival_s[i]))
        if n > len(w):
            raise ConfigError(f"the trace has {len(w)} requests, fewer than --cluster-requests {n}")
        return starts

    def _mean_output(self, cfg) -> float:
        from simulator.workload.load import generate
        w = generate(cfg.workload, np.random.SeedSequence(cfg.seed))
        return float(np.mean(w.output_tokens))

    def probe_data(self, c: Candidate, rate: float, k: int, *, replicas: int = 1,
                   requests: int | None = None) -> dict[str, Any]:
        import json
        data = json.loads(json.dumps(self.base))
        data["gpu"] = c.gpu
        eng = data.setdefault("engine", {})
        eng["tensor_parallel_size"] = c.tp
        wl = data.setdefault("workload", {})
        wl["num_requests"] = requests or self.s.requests
        wl.pop("duration_s", None)
        wl.pop("speedup", None)
        wl["target_rate"] = float(rate)
        if self.is_trace:
            wl["window_start_s"] = self._offsets[k] if replicas == 1 else \
                float(self.base.get("workload", {}).get("window_start_s", 0.0))
        data["seed"] = int(self.base.get("seed", 0)) + k
        if self.s.slo.min_goodput_share is not None:
            data["slo"] = {"ttft_s": self.s.slo.ttft_p99_s, "tpot_s": self.s.slo.tpot_p99_s}
        if replicas > 1:
            data["cluster"] = {"replicas": replicas, "router": self.s.router}
        return data

    def _run(self, datas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        tasks = [Task(task_id(d), {}, d["seed"], d) for d in datas]
        outcome = execute(tasks, self.out, workers=self.s.workers, backend=self.s.backend,
                          address=self.s.address, progress=False)
        if outcome.interrupted:
            raise KeyboardInterrupt
        return [outcome.records[t.id] for t in tasks]

    # --- step 1-3: max sustainable rate per candidate ---------------------------------------
    @staticmethod
    def _latency(records: list[dict[str, Any]]) -> float:
        """The largest mean E2E latency of the probes' seeds (0 when none finished)."""
        return max((r["metrics"].get("latency_s.e2e.mean") or 0.0 for r in records
                    if r["status"] == "ok"), default=0.0)

    def _steady(self, rate: float, records: list[dict[str, Any]], n: int) -> tuple[str, int]:
        """Whether n requests at `rate` that met the SLO reached a steady state (step 2 of the
        module docstring): ("", 0) they did; ("", N) run again with N requests (their arrivals
        spanned under STEADY_LATENCIES mean latencies); (why, 0) not within max_requests."""
        latency = self._latency(records)
        need = STEADY_LATENCIES * rate * latency
        if n >= need:
            return "", 0
        if n < self.s.max_requests:
            return "", min(math.ceil(need * 1.25), self.s.max_requests)
        return (f"no steady state within {n} requests: at {rate:.3g} req/s they arrive over "
                f"{n / rate:.3g} s, under {STEADY_LATENCIES:g} x the mean E2E latency "
                f"({latency:.3g} s; raise --max-requests)"), 0

    def _judge(self, c: Candidate, rate: float, records: list[dict[str, Any]], n: int
               ) -> tuple[str, int]:
        """(why the probes miss, '' when they meet the SLO at a steady state; requests to run
        them again with, 0 when this is the verdict, which joins `probes`)."""
        reasons = []
        for rec in records:
            if rec["status"] != "ok":
                reasons.append(rec["error"])
                continue
            why = self.s.slo.check(rec["metrics"])
            if why:
                reasons.append(why)
        if not reasons:
            why, again = self._steady(rate, records, n)
            if again:
                return "", again
            if why:
                reasons.append(why)
        ok = [r["metrics"] for r in records if r["status"] == "ok"]
        mean = lambda k: (float(np.mean([m[k] for m in ok if m.get(k) is not None]))  # noqa: E731
                          if any(m.get(k) is not None for m in ok) else None)
        self.probes.append({"candidate": c.name, "gpu": c.gpu, "tp": c.tp, "rate": rate,
                            "meets_slo": not reasons, "reason": reasons[0] if reasons else "",
                            "ttft_p99_s": mean("latency_s.ttft.p99"),
                            "tpot_p99_s": mean("latency_s.tpot.p99"),
                            "slo_share": mean("slo.share"), "seeds": len(records), "requests": n})
        return (reasons[0] if reasons else ""), 0

    def search(self, cands: list[Candidate]) -> dict[Candidate, dict[str, Any]]:
        """All candidates advance together, one round of probes at a time (parallel tasks)."""
        s = self.s
        # Low rates are the slow ones to simulate (one request per step), so the search starts
        # at target / 8 and moves by x4 until it brackets the limit.
        start = min(s.target_rate, max(s.r_min, s.target_rate / 8))
        state = {c: {"lo": 0.0, "hi": None, "next": start, "reason": ""} for c in cands}
        for c in cands:  # a model that does not fit is infeasible at any rate
            try:
                from simulator.engine.run import setup
                state[c]["memory"] = replica_memory(setup(from_dict(self.probe_data(c, s.r_min, 0))))
            except ConfigError as e:
                state[c].update(next=None, reason=str(e))
        while True:
            active = [c for c in cands if state[c]["next"] is not None]
            if not active:
                break
            datas = [self.probe_data(c, state[c]["next"], k, requests=state[c].get("requests"))
                     for c in active for k in range(s.seeds)]
            records = self._run(datas)
            for i, c in enumerate(active):
                st = state[c]
                rate = st["next"]
                n = st.get("requests") or s.requests
                recs = records[i * s.seeds:(i + 1) * s.seeds]
                why, again = self._judge(c, rate, recs, n)
                if again:  # the same rate again, over a longer span
                    st["requests"] = again
                    self.log(f"{c.name}: {rate:.3g} req/s: {n} requests span less than "
                             f"{STEADY_LATENCIES:g} mean latencies; again with {again}")
                    continue
                st["requests"] = None  # (each rate starts from --requests: no path dependence)
                if why:
                    st["hi"] = rate
                    st["why_lowest"] = why
                else:
                    st["lo"] = rate
                if st["hi"] is None:  # every probe met the SLO so far: go up
                    st["next"] = None if rate >= s.target_rate else min(rate * 4, s.target_rate)
                elif st["lo"] == 0.0:  # every probe missed: go down
                    if rate <= s.r_min:
                        st["next"] = None
                        st["reason"] = f"misses the SLO even at {rate:g} req/s: {why}"
                    else:
                        st["next"] = max(rate / 4, s.r_min)
                elif st["hi"] / st["lo"] <= 1 + s.rel_tol:
                    st["next"] = None
                else:
                    st["next"] = math.sqrt(st["lo"] * st["hi"])
                self.log(f"{c.name}: {rate:.3g} req/s {'meets' if not why else 'misses'} the SLO"
                         + (f" ({why})" if why else ""))
        return state

    def probes_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.probes)

    # --- step 4: replicas and cost ----------------------------------------------------------
    def price(self, gpu: str) -> float:
        spec = get_gpu(gpu)
        return float(self.s.prices.get(spec.name, self.s.prices.get(gpu, spec.price_per_hour)))

    def rank(self, state) -> pd.DataFrame:
        rows = []
        for c, st in state.items():
            r = st["lo"]
            price = self.price(c.gpu)
            row = {"candidate": c.name, "gpu": get_gpu(c.gpu).name, "tp": c.tp,
                   "price_per_gpu_hour": price, "max_rate_per_replica": r if r > 0 else None,
                   **dict.fromkeys(MEMORY_COLUMNS), **st.get("memory", {})}
            if r > 0:
                n = math.ceil(self.s.target_rate / r - 1e-9)
                cost = n * c.tp * price
                row.update(status="ok", replicas=n, gpus=n * c.tp, cost_per_hour=cost,
                           usd_per_million_output_tokens=cost / (
                               self.s.target_rate * self.mean_output_tokens * 3600) * 1e6,
                           note="" if st["hi"] is not None else
                           f"meets the SLO at the full target rate (search capped at {r:g} req/s)")
            else:
                row.update(status="infeasible", replicas=None, gpus=None, cost_per_hour=None,
                           usd_per_million_output_tokens=None, note=st["reason"])
            rows.append(row)
        df = pd.DataFrame(rows)
        df["_inf"] = df.status != "ok"
        df = df.sort_values(["_inf", "cost_per_hour", "gpus", "candidate"], na_position="last",
                            kind="stable").drop(columns="_inf").reset_index(drop=True)
        df.insert(0, "rank", np.where(df.status == "ok", np.arange(1, len(df) + 1), 0))
        df["rank"] = df["rank"].where(df.status == "ok", None)
        return df

    # --- confirmation -----------------------------------------------------------------------
    def cluster_check(self, c: Candidate, replicas: int) -> tuple[str, dict[str, Any]]:
        """One cluster run at the target rate (raised to a steady state as a probe is)."""
        n = self.s.cluster_requests
        while True:
            data = self.probe_data(c, self.s.target_rate, 0, replicas=replicas, requests=n)
            rec = self._run([data])[0]
            if rec["status"] != "ok":
                return rec["error"], {}
            why = self.s.slo.check(rec["metrics"])
            again = 0
            if not why:
                why, again = self._steady(self.s.target_rate, [rec], n)
            if not again:
                return why, rec["metrics"]
            n = again

    def confirm(self, c: Candidate, replicas: int) -> dict[str, Any]:
        """Smallest N near the estimate whose cluster meets the SLO, with N - 1's result."""
        results: dict[int, tuple[str, dict]] = {}
        if replicas > MAX_CONFIRM_REPLICAS:
            return {"candidate": c.name, "confirmed": False, "estimated_replicas": replicas,
                    "reason": f"{replicas} replicas: fleets over {MAX_CONFIRM_REPLICAS} are not "
                              f"cluster-simulated (the estimate stands unconfirmed)"}

        def check(n: int) -> str:
            if n not in results:
                results[n] = self.cluster_check(c, n)
                self.log(f"cluster {c.name} x {n} replicas at {self.s.target_rate:g} req/s: "
                         + ("meets the SLO" if not results[n][0] else f"misses ({results[n][0]})"))
            return results[n][0]

        n = replicas
        # (a run too short for a steady state stays so with more replicas: no more tries)
        while check(n) and n < min(replicas * 4 + 4, MAX_CONFIRM_REPLICAS) \
                and not results[n][0].startswith("no steady state"):
            n += 1
        if check(n):
            return {"candidate": c.name, "confirmed": False, "estimated_replicas": replicas,
                    "reason": results[n][0]}
        while n > 1 and not check(n - 1):
            n -= 1

        def brief(k: int) -> dict[str, Any] | None:
            if k not in results:
                return None
            why, m = results[k]
            return {"replicas": k, "meets_slo": not why, "reason": why,
                    "ttft_p99_s": m.get("latency_s.ttft.p99"), "tpot_p99_s": m.get("latency_s.tpot.p99"),
                    "slo_share": m.get("slo.share")}
        return {"candidate": c.name, "confirmed": True, "estimated_replicas": replicas,
                "replicas": n, "at_n": brief(n), "at_n_minus_1": brief(n - 1) if n > 1 else None}


def confirm_ranking(planner: Planner, table: pd.DataFrame) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Cluster-confirm candidates in rank order (module docstring); the table gains
    confirmed_replicas / confirmed_cost_per_hour and is re-ranked by confirmed cost first."""
    by_name = {c.name: c for c in planner.candidates}
    table = table.copy()
    table["confirmed_replicas"] = None
    table["confirmed_cost_per_hour"] = None
    table["estimated_cost_per_hour"] = table.cost_per_hour
    checks: list[dict[str, Any]] = []
    best = math.inf
    for idx, row in table[table.status == "ok"].iterrows():
        if row.cost_per_hour >= best:
            break
        c = by_name[row.candidate]
        res = planner.confirm(c, int(row.replicas))
        checks.append(res)
        if res["confirmed"]:
            n = res["replicas"]
            cost = n * c.tp * row.price_per_gpu_hour
            table.loc[idx, ["confirmed_replicas", "confirmed_cost_per_hour"]] = [n, cost]
            # the confirmed count is what to buy: GPUs and costs follow it
            table.loc[idx, "gpus"] = n * c.tp
            table.loc[idx, "cost_per_hour"] = cost
            table.loc[idx, "usd_per_million_output_tokens"] = cost / (
                planner.s.target_rate * planner.mean_output_tokens * 3600) * 1e6
            best = min(best, cost)
    # rank by cost as confirmed where checked, as estimated elsewhere; a confirmed row first
    table["_k"] = np.where(table.status == "ok", table.cost_per_hour.astype(float), math.inf)
    table["_u"] = table.confirmed_replicas.isna()
    table = table.sort_values(["_k", "_u", "rank"], kind="stable").drop(columns=["_k", "_u"])
    ok = table.status == "ok"
    table["rank"] = None
    table.loc[ok, "rank"] = np.arange(1, int(ok.sum()) + 1)
    return table.reset_index(drop=True), checks


def plot_plan(probes: pd.DataFrame, slo: PlanSlo, out: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    for (name, g) in probes.groupby("candidate", sort=False):
        g = g.sort_values("rate")
        for ax, col in zip(axes, ("ttft_p99_s", "tpot_p99_s")):
            line, = ax.plot(g.rate, g[col] * 1e3, marker="o", label=name)
            bad = g[~g.meets_slo]
            ax.plot(bad.rate, bad[col] * 1e3, "x", color=line.get_color(), markersize=9)
    for ax, target, title in zip(axes, (slo.ttft_p99_s, slo.tpot_p99_s), ("p99 TTFT", "p99 TPOT")):
        if target is not None:
            ax.axhline(target * 1e3, color="red", linestyle="--", linewidth=1, label="SLO")
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_xlabel("request rate per replica (req/s)")
        ax.set_ylabel(f"{title} (ms, mean over seeds)")
        ax.set_title(f"{title} vs rate (x: misses the SLO)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    return out
