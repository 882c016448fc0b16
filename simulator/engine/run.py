"""The one run loop: a SimConfig -> a Result (summary + tables), and the run directory.

A run is always a cluster (cluster.py): one replica by default, N behind a router. Setup,
seeding, the workload, progress and the SimPy environment are the same for every size; only the
summary differs: one replica's summary is the plain single-run schema with the engine's final
sections, several replicas' add `summary["cluster"]` and a `replica` column in the tables.

Outputs in the run directory:
- summary.json     the run summary (docs/metrics.md documents every field), sorted keys
- requests.parquet one row per request (finished and rejected)
- iterations.parquet one row per engine step (streamed there as the run goes when `run` is
                   given `iterations_path`: one replica; clusters write it at the end)
- config.yaml      the resolved configuration (every default filled in)
- timeseries.parquet, openmetrics.txt, alerts.json   monitoring (metrics.write_monitoring)
Same config + seed => byte-identical files: no wall clock and no global RNG reach them.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
import yaml

from simulator.config.schema import SimConfig
from simulator.engine.advance import ArrivalClock
from simulator.engine.build import Setup, setup
from simulator.engine.cluster import Cluster, MergedRecorder, cluster_section
from simulator.engine.kvcache.offload import offload_summary
from simulator.engine.protocols import RouterContext, SchedulerInterface, SchedulerStats
from simulator.engine.replica import Replica, feed_arrivals, lookahead, progress_tick, run_env
from simulator.engine.routers import ROUTERS
from simulator.engine.steptrace import StepTrace
from simulator.metrics.recorder import MetricsRecorder
from simulator.metrics.steps import StepColumns
from simulator.metrics.summary import clean_floats, summarize, write_monitoring
from simulator.metrics.table import Table
from simulator.workload.generators import RequestArrays
from simulator.workload.load import generate

if TYPE_CHECKING:
    import pandas as pd

_YAML_DUMPER = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper

__all__ = ["Result", "Setup", "add_engine_sections", "run", "run_config_summary", "setup"]


@dataclass
class Result:
    setup: Setup
    summary: dict[str, Any]
    # the requests table as the run made it: one replica's numpy columns (no pandas needed to
    # write the run directory), a cluster's DataFrame; `requests` is it as a DataFrame
    table: Table | pd.DataFrame
    recorder: MetricsRecorder | MergedRecorder = field(repr=False)  # the run's tables
    wall_s: float = field(default=0.0)  # informational only, never written to outputs
    # one replica's scheduler in its final state, for inspection (None for several replicas)
    scheduler: SchedulerInterface | None = field(default=None, repr=False)
    _iterations: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def requests(self) -> pd.DataFrame:
        """The requests table (one row per request, in req_id order) as a DataFrame (the
        recorder's, built once)."""
        return self.recorder.requests_frame()

    @property
    def iterations(self) -> pd.DataFrame:
        """The iterations table (one row per step; read back when it was streamed to a file;
        a run with keep_iterations=False and no file has none: ValueError)."""
        if self._iterations is None:
            self._iterations = self.recorder.iterations_frame()
        return self._iterations

    @property
    def steps(self) -> StepColumns:
        """The compact per-step columns the summary and the monitoring files are made from."""
        return self.recorder.step_columns()

    def write(self, out_dir: str | Path, *, interval_s: float | None = None,
              iterations: bool = True) -> Path:
        """The run directory; `interval_s` is the sampling interval of the time series (None:
        timeseries.auto_interval, 1 s unless the run is long); `iterations` False skips
        iterations.parquet (sweeps; an older one there is removed, so the directory never
        mixes runs). A streamed iterations file is moved (same file system) or copied there."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(
            json.dumps(clean_floats(self.summary), indent=2, sort_keys=True) + "\n")
        # NOTE: libyaml's emitter when PyYAML has it: the same text as safe_dump's (the same
        # representer; checked over 140 resolved configs), ~4x faster (~10 ms of a run)
        (out / "config.yaml").write_text(yaml.dump(self.setup.resolved_dict(), Dumper=_YAML_DUMPER,
                                                   sort_keys=True))
        if isinstance(self.table, Table):  # the bytes DataFrame.to_parquet writes (table.py)
            self.table.to_parquet(out / "requests.parquet")
        else:
            self.table.to_parquet(out / "requests.parquet", index=False)
        write_monitoring(out, self.table, self.steps, alerts=self.setup.config.alerts,
                         interval_s=interval_s, labels={"model_name": self.setup.model.name})
        # NOTE: last: a short run's iterations.parquet may still be being written (recorder.finish)
        target = out / "iterations.parquet"
        streamed = self.recorder.iterations_file() if isinstance(self.recorder, MetricsRecorder) else None
        if not iterations:
            target.unlink(missing_ok=True)
        elif streamed is None:
            self.iterations.to_parquet(target, index=False)
        elif streamed.resolve() != target.resolve():
            if streamed.parent.resolve() == out.resolve():
                os.replace(streamed, target)
                self.recorder.iterations_moved(target)
            else:
                import shutil
                shutil.copyfile(streamed, target)
        return out


def run_config_summary(s: Setup) -> dict[str, Any]:
    """The `config` section of a summary: what identifies the run (and the backend's info)."""
    config, e = s.config, s.engine
    return {"model": s.model.name, "gpu": s.gpu.name,
            "tensor_parallel_size": e.tensor_parallel_size,
            "kv_allocator": s.kv_allocator or config.engine.kv_allocator,
            "scheduler": config.engine.scheduler, "seed": config.seed,
            "num_gpu_blocks": s.memory.num_gpu_blocks, "block_size": e.block_size,
            "cost_model_calibrated": s.cost.calibrated, **s.format_info(), **s.backend.info()}


def run(config: SimConfig, workload: RequestArrays | None = None, *,
        progress: Callable[[int, int], None] | None = None, vectorized: bool = True,
        trace: StepTrace | None = None, on_setup: Callable[[Setup], None] | None = None,
        iterations_path: str | Path | None = None, keep_iterations: bool = True) -> Result:
    """Steps: 1. setup (names, plug-in params, memory, cost model: bad input fails here, before
    any work); 2. `on_setup(setup)`, e.g. to print the setup lines; 3. the workload from the seed;
    4. one scheduler, recorder and Replica process per replica, the router in front; 5. SimPy
    run until every arrival has finished or been rejected; 6. the summary and tables.
    `progress(ended, total)` is called every PROGRESS_EVERY (256) steps; `trace` records one
    replica's steps.
    Memory: `iterations_path` streams one replica's iterations table to that parquet file as
    the run goes (Result.write moves it into the run directory); `keep_iterations` False keeps
    no iterations table at all (only the compact columns of the summary; --no-iterations).
    Clusters keep their replicas' tables in memory (their rows are merged at the end)."""
    if config.cluster.mode == "disaggregated":  # prefill and decode pools (engine/disagg.py)
        # NOTE: imported here: the P/D module is only needed in this mode (~30 ms of start-up)
        from simulator.engine.disagg import run_disaggregated

        s, summary, reqs, rec, _ = run_disaggregated(config, workload, progress=progress,
                                                     vectorized=vectorized, on_setup=on_setup)
        summary["config"] = run_config_summary(s)
        return Result(s, summary, reqs, rec)
    s = setup(config)
    if on_setup is not None:
        on_setup(s)
    seeds = np.random.SeedSequence(config.seed).spawn(2)
    if workload is None:
        workload = generate(config.workload, seeds[0])
    n = s.cluster.replicas
    schedulers = [s.backend.build(s, workload, vectorized=vectorized) for _ in range(n)]
    if n == 1:
        recorders = [MetricsRecorder(schedulers[0].kv.total_slots, iterations_path=iterations_path,
                                     keep_iterations=keep_iterations)]
    else:
        recorders = [MetricsRecorder(sched.kv.total_slots) for sched in schedulers]
    tick = None
    if progress is not None:
        total = len(workload)
        ended = operator.attrgetter("num_ended")
        tick = progress_tick(lambda: progress(sum(map(ended, recorders)), total))
    env = simpy.Environment()
    clock = ArrivalClock() if config.engine.advance == "event" else None
    if clock is not None and n == 1:  # runs may admit the arrivals ahead
        clock.ahead = lookahead(workload)
    replicas = [Replica(env, sched, s.cost, rec, s.engine.max_model_len, on_iteration=tick,
                        trace=trace if n == 1 else None, clock=clock, solo=n == 1)
                for sched, rec in zip(schedulers, recorders)]
    router = ROUTERS.build(s.cluster.router, s.params.router, "cluster.router_params",
                           RouterContext(n, config.engine.enable_prefix_caching,
                                         workload.prefix_block_tokens))
    cluster = Cluster(replicas, router)
    env.process(feed_arrivals(env, workload, cluster, clock))
    t0 = time.perf_counter()
    try:
        run_env(env)
    except BaseException:
        for rec in recorders:  # (a row group may be in flight: nothing may write the file after)
            rec.abort()
        raise
    wall = time.perf_counter() - t0
    if n == 1:  # the plain single-replica outputs
        merged: MetricsRecorder | MergedRecorder = recorders[0]
    else:
        merged = MergedRecorder(recorders)
    summary = summarize(merged, cluster.num_arrived, slo=config.slo, alerts=config.alerts,
                        kv_allocator=config.engine.kv_allocator)
    summary["config"] = run_config_summary(s)
    if n == 1:
        add_engine_sections(summary, schedulers[0].stats())
    else:
        # NOTE: no engine sections (evictions, swap) for clusters yet, as before the one loop
        summary["cluster"] = cluster_section(s.cluster, cluster, recorders, config)
    table = merged.requests_table()
    return Result(s, summary, table, merged, wall, schedulers[0] if n == 1 else None)


def add_engine_sections(summary: dict[str, Any], stats: SchedulerStats) -> None:
    """What only the engine's final state knows: prefix-cache evictions and the idle age of the
    evicted blocks (when the KV manager keeps them), and swap traffic (summary `swap` section,
    when the scheduler has a swap space)."""
    kv = stats.kv
    if kv.num_evictions is not None and kv.evicted_idle_s is not None:
        idle = np.asarray(kv.evicted_idle_s)
        summary["prefix_cache"]["evictions"] = int(kv.num_evictions)
        summary["prefix_cache"]["evicted_idle_s"] = {
            name: (float(f(idle)) if len(idle) else None)
            for name, f in (("mean", np.mean), ("p50", np.median),
                            ("p99", lambda x: np.percentile(x, 99)))}
    if stats.offload is not None:  # the CPU offload tier's section (kvcache/offload.py)
        summary["kv_offload"] = offload_summary(stats.offload, summary["prefix_cache"])
    swap = stats.swap
    if swap is not None:
        busy = summary["busy_s"]
        summary["swap"] = {"swap_outs": swap.num_swap_outs, "swap_ins": swap.num_swap_ins,
                           "bytes": int(swap.bytes_moved), "seconds": swap.seconds,
                           "time_share": swap.seconds / busy if busy > 0 else 0.0,
                           "fallbacks_to_recompute": stats.num_preemptions - swap.num_swap_outs}
