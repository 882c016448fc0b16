"""A cluster: N identical replicas behind a router, in one SimPy environment.

Config: a `cluster:` section, `{replicas: N, router: name, router_params: {...}}`; with one
replica (the default) `kvsim run` is the plain single-replica run, byte for byte.

Routers (registry ROUTERS; each is a small class with `choose(req, cluster) -> replica index`):
- round_robin: replicas in turn;
- least_outstanding: fewest routed-but-unfinished requests (`by: requests`) or tokens
  (`by: tokens`, prompt + output of those requests);
- kv_aware: least projected KV use = used slots + prompt tokens routed but not yet scheduled,
  as a share of the pool (the pending term stops a burst from herding onto one replica
  between two engine steps);
- prefix_affinity: the replica holding the longest leading part of the prompt, judged by its
  prefix cache (block hashes looked up without side effects) and by the chunk ids this router
  sent it before (requests still in flight); a prefix every replica holds does not count, and
  when loads are imbalanced (`balance_rel`, `balance_abs`) the least loaded replica wins, so a
  popular prefix cannot pin all traffic on one replica.
Ties go to fewer outstanding requests, then the lower index: routing is deterministic.

Outputs: requests.parquet and iterations.parquet gain a `replica` column. The cluster
summary has the single-run schema (metrics.py) over all requests; its gauges are cluster
totals (running, waiting, KV slots summed over replicas; KV usage the replicas' mean) updated
at every replica's step end, batch statistics count each replica's step once, busy_s is
summed GPU-replica time. `summary["cluster"]` adds the router, per-replica figures and the
load imbalance (max / mean routed requests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simulator.config.registry import Registry
from simulator.config.sections import ClusterConfig
from simulator.engine.replica import Replica, feed_arrivals
from simulator.errors import ConfigError, did_you_mean
from simulator.metrics.summary import MetricsRecorder, summarize
from simulator.workload.request import Request

ROUTERS: Registry[type] = Registry("router")

CLUSTER_KEYS = ("replicas", "router", "router_params")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    replicas: int = 1
    router: str = "round_robin"
    router_params: dict = field(default_factory=dict)


def resolve_cluster(spec: dict[str, Any] | None) -> ClusterSpec:
    """The validated `cluster:` section (one ConfigError per rule, naming field and value)."""
    if isinstance(spec, ClusterConfig):  # the config's typed section
        spec = spec.to_dict()
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ConfigError(f"cluster: expected a mapping with {', '.join(CLUSTER_KEYS)}, got {spec!r}")
    for key in spec:
        if key not in CLUSTER_KEYS:
            raise ConfigError(f"cluster: unknown key {key!r}{did_you_mean(key, CLUSTER_KEYS)}; "
                              f"valid: {', '.join(CLUSTER_KEYS)}")
    n = spec.get("replicas", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"cluster.replicas must be an integer >= 1, got {n!r}")
    router = spec.get("router", "round_robin")
    if not isinstance(router, str):
        raise ConfigError(f"cluster.router must be a router name, got {router!r}")
    try:
        cls = ROUTERS.get(router)
    except ConfigError as e:
        raise ConfigError(f"cluster.router: {e}") from None
    params = spec.get("router_params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"cluster.router_params must be a mapping, got {params!r}")
    cls(**params)  # validates
    return ClusterSpec(n, router, dict(params))


def _check_params(router: str, params: dict[str, Any], allowed: dict[str, Any]) -> None:
    for key, value in params.items():
        if key not in allowed:
            raise ConfigError(f"cluster.router_params: unknown key {key!r} for router {router}"
                              f"{did_you_mean(key, list(allowed))}; valid: {', '.join(allowed) or 'none'}")
        check = allowed[key]
        if isinstance(check, tuple) and value not in check:
            raise ConfigError(f"cluster.router_params.{key} must be one of {', '.join(check)}, "
                              f"got {value!r}")
        if check == "pos" and (isinstance(value, bool) or not isinstance(value, (int, float))
                               or not value > 0):
            raise ConfigError(f"cluster.router_params.{key} must be a number > 0, got {value!r}")


# --- routers ---------------------------------------------------------------------------------
@ROUTERS.register("round_robin")
class RoundRobin:
    def __init__(self, **params) -> None:
        _check_params("round_robin", params, {})
        self.next = 0

    def choose(self, req: Request, cluster: Cluster) -> int:
        i = self.next
        self.next = (i + 1) % len(cluster.replicas)
        return i


@ROUTERS.register("least_outstanding")
class LeastOutstanding:
    def __init__(self, by: str = "requests", **params) -> None:
        _check_params("least_outstanding", {"by": by, **params}, {"by": ("requests", "tokens")})
        self.by = by

    def choose(self, req: Request, cluster: Cluster) -> int:
        load = cluster.outstanding if self.by == "requests" else cluster.outstanding_tokens
        return int(np.argmin(load))  # first minimum: the lowest index wins ties


@ROUTERS.register("kv_aware")
class KvAware:
    def __init__(self, **params) -> None:
        _check_params("kv_aware", params, {})

    def choose(self, req: Request, cluster: Cluster) -> int:
        best, best_key = 0, None
        for i, rep in enumerate(cluster.replicas):
            kv = rep.kv
            key = ((kv.used_slots + cluster.pending_prompt_tokens(i)) / max(kv.total_slots, 1),
                   cluster.outstanding[i], i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best


@ROUTERS.register("prefix_affinity")
class PrefixAffinity:
    """Cache-aware routing with a load guard (the shape of SGLang's cache-aware router)."""

    # Defaults: a replica may run 1.5x and 8 requests above the least loaded one before
    # affinity yields to balance; both bounds must be exceeded (small loads stay sticky).
    def __init__(self, balance_rel: float = 1.5, balance_abs: float = 8, **params) -> None:
        _check_params("prefix_affinity", {"balance_rel": balance_rel, "balance_abs": balance_abs,
                                          **params}, {"balance_rel": "pos", "balance_abs": "pos"})
        self.balance_rel = float(balance_rel)
        self.balance_abs = float(balance_abs)
        self.chunk_to_replicas: dict[int, set[int]] = {}  # prefix chunk id -> replicas sent it

    @staticmethod
    def _cached_tokens(req: Request, rep: Replica, max_blocks: int) -> int:
        kv = rep.kv
        get = kv.pool.get_cached_block
        n = 0
        for h in kv.hasher.hashes(req, max_blocks)[:max_blocks]:  # no side effect on the pool
            if get(h) is None:
                break
            n += 1
        return n * kv.block_size

    def _served_tokens(self, req: Request, i: int, chunk: int) -> int:
        depth = 0
        for cid in req.prefix:
            if i not in self.chunk_to_replicas.get(int(cid), ()):
                break
            depth += 1
        return min(depth * chunk, req.prompt_tokens)

    def choose(self, req: Request, cluster: Cluster) -> int:
        """Steps: 1. imbalanced (max load > balance_rel x min and > min + balance_abs): the
        least loaded replica; 2. score each replica: max(cached leading tokens in its prefix
        cache, leading tokens of chunks this router sent it before; the latter covers
        requests still in flight); 3. a score above the lowest one (a prefix every replica
        holds, e.g. a shared system prompt, does not count): best score, then fewer
        outstanding, then lower index; otherwise the least loaded; 4. remember the request's
        chunk ids -> the choice."""
        reps = cluster.replicas
        load = cluster.outstanding
        least = min(range(len(reps)), key=lambda i: (load[i], i))
        lo, hi = load[least], max(load)
        if hi > self.balance_rel * lo and hi > lo + self.balance_abs:
            best = least
        else:
            best = least
            kv0 = reps[0].kv
            if req.prefix is not None and getattr(kv0, "enable_prefix_caching", False):
                max_blocks = (req.prompt_tokens - 1) // kv0.block_size
                chunk = kv0.hasher.chunk_tokens
                scores = [max(self._cached_tokens(req, rep, max_blocks) if max_blocks else 0,
                              self._served_tokens(req, i, chunk)) for i, rep in enumerate(reps)]
                if max(scores) > min(scores):
                    best = min(range(len(reps)), key=lambda i: (-scores[i], load[i], i))
        if req.prefix is not None:
            for cid in req.prefix:
                self.chunk_to_replicas.setdefault(int(cid), set()).add(best)
        return best


# --- the cluster -----------------------------------------------------------------------------
class _RoutedRecorder(MetricsRecorder):
    """A replica's recorder that also tells the cluster when a request leaves."""

    def __init__(self, total_slots: int, on_end) -> None:
        super().__init__(total_slots)
        self._on_end = on_end

    def request_ended(self, req: Request) -> None:
        super().request_ended(req)
        self._on_end(req)


class Cluster:
    """Stands where feed_arrivals expects a replica: `submit` routes, `close` closes all."""

    def __init__(self, replicas: list[Replica], router) -> None:
        self.replicas = replicas
        self.router = router
        n = len(replicas)
        self.outstanding = [0] * n
        self.outstanding_tokens = [0] * n
        self.routed = [0] * n
        self.num_arrived = 0
        self.req_to_replica: dict[int, int] = {}
        self._pending: list[list[Request]] = [[] for _ in range(n)]  # routed, not yet scheduled

    def pending_prompt_tokens(self, i: int) -> int:
        live = [r for r in self._pending[i] if r.first_scheduled_s < 0 and r.status.value == "waiting"]
        self._pending[i] = live
        return sum(r.prompt_tokens for r in live)

    def request_ended(self, req: Request) -> None:
        i = self.req_to_replica[req.req_id]
        self.outstanding[i] -= 1
        self.outstanding_tokens[i] -= req.prompt_tokens + req.output_tokens

    def submit(self, req: Request) -> None:
        self.num_arrived += 1
        i = self.router.choose(req, self)
        self.req_to_replica[req.req_id] = i
        self.routed[i] += 1
        self.outstanding[i] += 1
        self.outstanding_tokens[i] += req.prompt_tokens + req.output_tokens
        self._pending[i].append(req)
        self.replicas[i].submit(req)

    def close(self) -> None:
        for rep in self.replicas:
            rep.close()


def run_cluster(config, workload=None, *, progress=None, vectorized: bool = True):
    """Steps: 1. setup once (all replicas are identical); 2. workload from the seed (as a single
    run draws it); 3. one engine + Replica process per replica, the router in front; 4. SimPy
    run; 5. merged tables and the cluster summary with per-replica figures."""
    from simulator.engine.run import Result, build_engine, run_config_summary, setup
    from simulator.workload.load import generate

    spec = resolve_cluster(config.cluster)
    s = setup(config)
    seeds = np.random.SeedSequence(config.seed).spawn(2)
    if workload is None:
        workload = generate(config.workload, seeds[0])
    env = simpy.Environment()
    router = ROUTERS.get(spec.router)(**spec.router_params)
    cluster: Cluster | None = None
    recorders: list[MetricsRecorder] = []
    replicas: list[Replica] = []

    def ended(req: Request) -> None:
        cluster.request_ended(req)

    tick = None
    if progress is not None:
        total = len(workload)

        def tick() -> None:
            progress(sum(len(r.requests) for r in recorders), total)
    for _ in range(spec.replicas):
        sched, rec = build_engine(s, workload, lambda slots: _RoutedRecorder(slots, ended))
        sched.vectorized = vectorized
        recorders.append(rec)
        replicas.append(Replica(env, sched, s.cost, rec, s.engine.max_model_len, on_iteration=tick))
    cluster = Cluster(replicas, router)
    env.process(feed_arrivals(env, workload, cluster))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    merged = _MergedRecorder(recorders)
    summary = summarize(merged, cluster.num_arrived, slo=config.slo, alerts=config.alerts,
                        kv_allocator=config.engine.kv_allocator)
    summary["config"] = run_config_summary(s)
    per_replica = []
    for i, rec in enumerate(recorders):
        one = summarize(rec, cluster.routed[i], slo=config.slo, alerts={},
                        kv_allocator=config.engine.kv_allocator)
        per_replica.append({
            "replica": i, "routed": cluster.routed[i], "finished": one["requests"]["finished"],
            "rejected": one["requests"]["rejected"],
            "ttft_p99_s": one["latency_s"]["ttft"]["p99"],
            "tpot_p99_s": one["latency_s"]["tpot"]["p99"],
            "kv_usage_mean": one["kv_cache"]["usage_mean"],
            "prefix_cache_hit_rate": one["prefix_cache"]["hit_rate"],
            "preemptions": one["preemptions"]["total"], "busy_s": one["busy_s"],
            "output_tokens": int(rec.requests_frame().query("status == 'finished'").output_tokens.sum()),
        })
    mean_routed = sum(cluster.routed) / len(cluster.routed)
    summary["cluster"] = {"replicas": spec.replicas, "router": spec.router,
                          "router_params": spec.router_params,
                          "imbalance": max(cluster.routed) / mean_routed if mean_routed else None,
                          "per_replica": per_replica}
    return Result(s, summary, merged.requests_frame(), merged.iterations_frame(), wall, None)


class _MergedRecorder:
    """The replicas' recorders seen as one: what `summarize` reads (module docstring)."""

    GAUGES_SUMMED = ("num_running", "num_waiting", "kv_used_slots", "kv_tokens_stored",
                     "kv_external_frag_slots")

    def __init__(self, recorders: list[MetricsRecorder]) -> None:
        self.recorders = recorders
        self.total_slots = sum(r.total_slots for r in recorders)
        self._iters: pd.DataFrame | None = None

    def requests_frame(self) -> pd.DataFrame:
        frames = []
        for i, rec in enumerate(self.recorders):
            df = rec.requests_frame()
            df.insert(1, "replica", np.full(len(df), i, np.int64))
            frames.append(df)
        return pd.concat(frames, ignore_index=True).sort_values("req_id", kind="stable") \
            .reset_index(drop=True)

    def iterations_frame(self) -> pd.DataFrame:
        """Every replica's steps, ordered by end time (then replica); gauges become cluster
        totals as of that step end (each replica's last value, 0 before its first step)."""
        if self._iters is not None:
            return self._iters
        frames = []
        for i, rec in enumerate(self.recorders):
            df = rec.iterations_frame()
            df.insert(0, "replica", np.full(len(df), i, np.int64))
            frames.append(df)
        it = pd.concat(frames, ignore_index=True)
        end = (it.start_s + it.duration_s).to_numpy()
        order = np.lexsort((it.replica.to_numpy(), end))
        it = it.iloc[order].reset_index(drop=True)
        rep = it.replica.to_numpy()
        n = len(self.recorders)

        def latest(col: str) -> np.ndarray:
            m = np.full((len(it), n), np.nan)
            m[np.arange(len(it)), rep] = it[col].to_numpy(np.float64)
            return pd.DataFrame(m).ffill().fillna(0.0).to_numpy()

        for col in self.GAUGES_SUMMED:
            if col in it:
                total = latest(col).sum(axis=1)
                it[col] = total.astype(it[col].dtype) if it[col].dtype.kind == "i" else total
        it["kv_usage"] = latest("kv_usage").mean(axis=1)
        self._iters = it
        return it

    def token_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        parts = [r.token_gaps() for r in self.recorders]
        v = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        order = np.argsort(v, kind="stable")
        return v[order], c[order]
