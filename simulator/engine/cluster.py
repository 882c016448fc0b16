"""A cluster: N identical replicas behind a router, in one SimPy environment.

Config: a `cluster:` section, `{replicas: N, router: name, router_params: {...}}`; one replica
(the default) is a cluster of one: requests go straight to it and the outputs are the plain
single-replica ones, byte for byte. Routers live in routers/ (one module each); each is built
from a RouterContext and its validated params and picks a replica per arrival, reading the
cluster only through protocols.ClusterView. Ties go to fewer outstanding requests, then the
lower index: routing is deterministic.

Outputs with N > 1: requests.parquet and iterations.parquet gain a `replica` column. The cluster
summary has the single-run schema (metrics docs) over all requests; its gauges are cluster
totals (running, waiting, KV slots summed over replicas; KV usage the replicas' mean) updated
at every replica's step end, batch statistics count each replica's step once, busy_s is
summed GPU-replica time. `summary["cluster"]` adds the router, per-replica figures and the
load imbalance (max / mean routed requests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.config.sections import ClusterConfig
from simulator.engine.protocols import KVCacheView, Router
from simulator.engine.replica import Replica
from simulator.engine.routers import ROUTERS
from simulator.errors import ConfigError
from simulator.metrics.recorder import MetricsRecorder
from simulator.metrics.steps import StepColumns, as_steps
from simulator.metrics.summary import summarize
from simulator.workload.request import Request, Status

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    replicas: int = 1
    router: str = "round_robin"
    router_params: dict = field(default_factory=dict)  # as written (the summary echoes it)


def resolve_cluster(spec: ClusterConfig | dict[str, Any] | None) -> ClusterSpec:
    """The `cluster:` section with its router checked: the section itself is the config's
    (ClusterConfig, validated there; a raw mapping is validated the same way), the router name
    and router_params are checked here against the router registry and the router's own params
    model (config sits below the engine and cannot see the registry)."""
    spec = ClusterConfig.from_section(spec)
    try:
        ROUTERS.get(spec.router)
    except ConfigError as e:
        raise ConfigError(f"cluster.router: {e}") from None
    params = dict(spec.router_params)
    ROUTERS.validate_params(spec.router, params, "cluster.router_params")
    return ClusterSpec(spec.replicas, spec.router, params)


class Cluster:
    """Stands where feed_arrivals expects a replica: `submit` routes, `close` closes all. It is
    the routers' protocols.ClusterView."""

    def __init__(self, replicas: list[Replica], router: Router) -> None:
        self.replicas = replicas
        self.router = router
        n = self.num_replicas = len(replicas)
        self.outstanding = [0] * n
        self.outstanding_tokens = [0] * n
        self.routed = [0] * n
        self.num_arrived = 0
        self.req_to_replica: dict[int, int] = {}
        self._pending: list[list[Request]] = [[] for _ in range(n)]  # routed, not yet scheduled
        self._prune_at = [64] * n  # NOTE: pruned when it doubles: memory bounded by the live ones
        # the per-replica loads are the routers' (one replica: no router runs, only the counts)
        self._loads = n > 1
        if self._loads:
            for rep in replicas:  # the replicas exist first: each tells the cluster who leaves
                rep.on_request_end = self.request_ended

    def kv(self, i: int) -> KVCacheView:
        return self.replicas[i].kv

    def pending_prompt_tokens(self, i: int) -> int:
        return sum(r.prompt_tokens for r in self._prune(i))

    def _prune(self, i: int) -> list[Request]:
        live = [r for r in self._pending[i] if r.first_scheduled_s < 0 and r.status is Status.WAITING]
        self._pending[i] = live
        self._prune_at[i] = 2 * len(live) + 64
        return live

    def request_ended(self, req: Request) -> None:
        if not self._loads:
            return
        i = self.req_to_replica.pop(req.req_id)  # its last use: the map holds live requests only
        self.outstanding[i] -= 1
        self.outstanding_tokens[i] -= req.prompt_tokens + req.output_tokens

    def submit(self, req: Request) -> None:
        """1.-2. `route`; 3. the replica takes the request."""
        self.replicas[self.route(req)].submit(req)

    def route(self, req: Request) -> int:
        """1. the router picks a replica (no choice with one); 2. book-keeping for the routers
        (with one replica only the counts: no router reads the loads).
        (P/D's decode pool routes when the prefill ends and submits when the KV has arrived.)"""
        self.num_arrived += 1
        if not self._loads:
            self.routed[0] += 1
            return 0
        i = self.router.choose(req, self)
        self.req_to_replica[req.req_id] = i
        self.routed[i] += 1
        self.outstanding[i] += 1
        self.outstanding_tokens[i] += req.prompt_tokens + req.output_tokens
        self._pending[i].append(req)
        if len(self._pending[i]) > self._prune_at[i]:
            self._prune(i)
        return i

    def count_taken(self, n: int) -> None:
        """n arrivals that the only replica admitted itself (advance.Lookahead): counted as
        routed to it and as arrived there, as `submit` counts them."""
        self.num_arrived += n
        self.routed[0] += n
        self.replicas[0].num_arrived += n

    def close(self) -> None:
        for rep in self.replicas:
            rep.close()


def cluster_section(spec: ClusterSpec, cluster: Cluster, recorders: list[MetricsRecorder],
                    config) -> dict[str, Any]:
    """summary["cluster"]: the router, per-replica figures and the load imbalance."""
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
    return {"replicas": spec.replicas, "router": spec.router, "router_params": spec.router_params,
            "imbalance": max(cluster.routed) / mean_routed if mean_routed else None,
            "per_replica": per_replica}


class MergedRecorder:
    """The replicas' recorders seen as one: what `summarize` reads (module docstring)."""

    GAUGES_SUMMED = ("num_running", "num_waiting", "kv_used_slots", "kv_tokens_stored",
                     "kv_external_frag_slots")

    def __init__(self, recorders: list[MetricsRecorder]) -> None:
        self.recorders = recorders
        self.total_slots = sum(r.total_slots for r in recorders)
        self._iters: pd.DataFrame | None = None
        self._reqs: pd.DataFrame | None = None  # requests_frame, built once

    def requests_table(self) -> pd.DataFrame:
        """What `summarize` and a run's Result read (a DataFrame: summary.column reads it as it
        reads one replica's Table)."""
        return self.requests_frame()

    def requests_frame(self) -> pd.DataFrame:
        import pandas as pd  # NOTE: here: a one-replica run needs no pandas (metrics/table.py)

        if self._reqs is None:
            frames = []
            for i, rec in enumerate(self.recorders):
                df = rec.requests_frame().copy()
                df.insert(1, "replica", np.full(len(df), i, np.int64))
                frames.append(df)
            self._reqs = pd.concat(frames, ignore_index=True).sort_values("req_id", kind="stable") \
                .reset_index(drop=True)
        return self._reqs

    def iterations_frame(self) -> pd.DataFrame:
        """Every replica's steps, ordered by end time (then replica); gauges become cluster
        totals as of that step end (each replica's last value, 0 before its first step)."""
        if self._iters is not None:
            return self._iters
        import pandas as pd

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

    def busy_s(self) -> float:
        it = self.iterations_frame()
        return float(it.duration_s.sum()) if len(it) else 0.0

    def step_columns(self) -> StepColumns:
        return as_steps(self.iterations_frame())

    def token_gaps(self, *, release: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Every replica's gaps (`release` is the recorders' own: the per-replica summaries
        still read them, so nothing is released here)."""
        parts = [r.token_gaps() for r in self.recorders]
        v = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        order = np.argsort(v, kind="stable")
        return v[order], c[order]
