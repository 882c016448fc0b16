"""Event-level advance (engine.advance: event) against the step-by-step reference."""

from __future__ import annotations

import contextlib
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.config.schema import build_config
from simulator.engine.advance import decode_run_times, exact_delay
from simulator.engine.costmodel import CostModel, StepShape
from simulator.engine.run import run
from simulator.engine.steptrace import StepTrace
from simulator.errors import ConfigError
from simulator.hardware.gpus import get_gpu
from simulator.hardware.models import get_model
from simulator.metrics.recorder import MetricsRecorder, StepRecord

TIERS = ('{by: prompt_tokens, tiers: [{name: short, max_prompt_tokens: 300, max_seq_share: 0.5},'
         ' {name: long}]}')


@contextlib.contextmanager
def _lookahead(on: bool):
    """Runs made inside have the lookahead of a replica alone (engine/run.py) or, off, none."""
    if on:
        yield
        return
    import simulator.engine.run as run_mod
    made = run_mod.lookahead
    run_mod.lookahead = lambda workload: None
    try:
        yield
    finally:
        run_mod.lookahead = made


def _outputs(overrides: list[str], advance: str, out: Path, traced: bool = True,
             spans: bool = True) -> tuple[dict[str, bytes], list]:
    """The run's files and its step trace (`traced` False: none). `spans` False: no lookahead,
    so a replica alone runs without spans (scheduling/span.py), as a cluster's replicas do."""
    config = build_config(None, [*overrides, f"engine.advance={advance}"])
    trace = StepTrace() if traced else None
    with _lookahead(spans):
        res = run(config, trace=trace)
    res.write(out)
    files = {name: (out / name).read_bytes()
             for name in ("summary.json", "requests.parquet", "iterations.parquet")}
    return files, [] if trace is None else trace.rows


scenario = st.fixed_dictionaries({
    "engine.kv_allocator": st.sampled_from(["paged", "paged", "contiguous"]),
    "engine.scheduler": st.sampled_from(["continuous", "continuous", "static"]),
    "engine.enable_chunked_prefill": st.booleans(),
    "engine.enable_prefix_caching": st.booleans(),
    "engine.queue_policy": st.sampled_from(["fcfs", "priority", "tiered"]),
    "engine.preemption_mode": st.sampled_from(["recompute", "swap"]),
    "engine.num_gpu_blocks_override": st.sampled_from([None, 300, 700]),
    "replicas": st.sampled_from([1, 1, 3]),
    "cluster.router": st.sampled_from(["round_robin", "least_outstanding", "kv_aware",
                                       "prefix_affinity"]),
    "sessions": st.booleans(),
    "workload.arrival.rate": st.sampled_from([2.0, 10.0, 60.0]),
    "seed": st.integers(0, 3),
    # unset: vLLM 0.33's default (async unless the mode is one that schedules synchronously)
    "engine.async_scheduling": st.sampled_from([None, None, False]),
})


def _overrides(s: dict) -> list[str]:
    out = [f"seed={s['seed']}", "engine.max_model_len=4096",
           "engine.max_num_batched_tokens=4096",
           f"workload.arrival.rate={s['workload.arrival.rate']}"]
    if s["sessions"]:
        out = ["workload.duration_s=20", "workload.sessions.turns={dist: uniform, low: 1, high: 4}",
               "workload.sessions.think_time_s={dist: lognormal, mean: 3, cv: 1.0, max: 20}",
               "workload.system_prompts.count=3",
               "workload.system_prompts.tokens={dist: lognormal, mean: 600, cv: 0.5, max: 1500}",
               "workload.prompt_tokens={dist: lognormal, mean: 100, cv: 1.0, max: 600}",
               "workload.output_tokens={dist: lognormal, mean: 80, cv: 0.8, max: 400}", *out]
    else:
        out.append("workload.num_requests=80")
    for key in ("engine.kv_allocator", "engine.scheduler", "engine.enable_chunked_prefill",
                "engine.enable_prefix_caching", "engine.queue_policy", "engine.preemption_mode"):
        out.append(f"{key}={str(s[key]).lower()}")
    if s["engine.async_scheduling"] is not None:
        out.append(f"engine.async_scheduling={str(s['engine.async_scheduling']).lower()}")
    if s["engine.num_gpu_blocks_override"] is not None:
        out.append(f"engine.num_gpu_blocks_override={s['engine.num_gpu_blocks_override']}")
    if s["engine.queue_policy"] == "tiered":
        out.append(f"engine.queue_params={TIERS}")
    if s["replicas"] > 1:
        out += [f"cluster.replicas={s['replicas']}", f"cluster.router={s['cluster.router']}"]
    return out


def _check_identical(s) -> None:
    overrides = _overrides(s)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            step, step_trace = _outputs(overrides, "step", Path(tmp) / "step")
        except ConfigError:
            return  # a combination the config rejects (same for both modes)
        event, event_trace = _outputs(overrides, "event", Path(tmp) / "event")
        nospan, nospan_trace = _outputs(overrides, "event", Path(tmp) / "nospan", spans=False)
    for name in step:
        assert event[name] == step[name], (name, overrides)
        assert nospan[name] == step[name], (name, "no spans", overrides)
    assert event_trace == step_trace, overrides
    assert nospan_trace == step_trace, ("no spans", overrides)


def _over(strategy, check, examples: int):
    """A test of `check` over `examples` scenarios drawn from `strategy`."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def test(s):
        check(s)
    return test


test_event_level_advance_gives_byte_identical_outputs = _over(scenario, _check_identical, 8)
# the same check over more scenarios (CI runs it: -m slow)
test_event_level_advance_gives_byte_identical_outputs_many = pytest.mark.slow(
    _over(scenario, _check_identical, 60))


@pytest.mark.parametrize("mode", [
    # W1: prefill-first steps (synchronous, vLLM v0)
    ["engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=4096"],
    # chunked prefill, async scheduling (vLLM 0.33's default), two batches in flight
    ["engine.async_scheduling=true", "engine.max_num_batched_tokens=512"],
])
def test_decode_runs_happen_and_cut_the_loop(mode):
    """W1-like light load: most steps come from decode runs, and the outputs are the same."""
    overrides = [*mode, "engine.enable_prefix_caching=false",
                 "workload.num_requests=40", "workload.arrival.rate=1.0", "model=llama-2-7b",
                 "gpu=a100-80gb"]
    trace_s = _same_as_step(overrides)
    import simulator.engine.scheduling.scheduler as sched_mod
    calls = []
    original = sched_mod.Scheduler.decode_run

    def counting(self, *a, **k):
        r = original(self, *a, **k)
        if r is not None:
            calls.append(len(r.starts) - 1)
        return r
    sched_mod.Scheduler.decode_run = counting
    try:
        run(build_config(None, overrides))
    finally:
        sched_mod.Scheduler.decode_run = original
    assert sum(calls) > 0.8 * len(trace_s)  # most steps advanced in runs
    assert len(calls) < 0.05 * len(trace_s)


def _same_as_step(overrides: list[str]) -> list:
    """The event-level run's outputs and step trace against the step loop's (byte-identical,
    equal); the trace."""
    with tempfile.TemporaryDirectory() as tmp:
        step, trace_s = _outputs(overrides, "step", Path(tmp) / "s")
        event, trace_e = _outputs(overrides, "event", Path(tmp) / "e")
        nospan, trace_n = _outputs(overrides, "event", Path(tmp) / "n", spans=False)
    assert event == step
    assert nospan == step
    assert trace_e == trace_s
    assert trace_n == trace_s
    return trace_s


def _run_counting(overrides: list[str], spans: bool = False) -> dict[str, int]:
    """One event-level run, counting its loop steps, decode runs and the finishes inside them;
    of those, the runs taken through finishes in one pass (their segments and finishes), the
    runs that opened with a prompt step (and those that were that step alone) and the spans
    (scheduling/span.py: with `spans`, else the run has no lookahead) with the arrivals they
    admitted."""
    import simulator.engine.scheduling.scheduler as sched_mod
    counts = dict.fromkeys(("loop", "runs", "run_steps", "finished_in_runs", "through", "segments",
                            "finished_in_through", "prompt_runs", "prompt_alone", "spans",
                            "span_taken", "span_steps"), 0)
    span_run = sched_mod.span_run

    def counting_span(*a, **k):
        r = span_run(*a, **k)
        if r is not None:
            counts["spans"] += 1
            counts["span_taken"] += r.taken
            counts["span_steps"] += len(r.starts) - 1
        return r
    sched_mod.span_run = counting_span
    cls = sched_mod.Scheduler
    originals = {name: getattr(cls, name)
                 for name in ("decode_run", "schedule", "_decode_run_through", "_prompt_then_run")}

    def counting_run(self, *a, **k):
        r = originals["decode_run"](self, *a, **k)
        if r is not None:
            counts["runs"] += 1
            counts["run_steps"] += len(r.starts) - 1
            counts["finished_in_runs"] += sum(len(p.finished) for p in r.parts)
        return r

    def counting_schedule(self, *a, **k):
        counts["loop"] += 1
        return originals["schedule"](self, *a, **k)

    def counting_through(self, *a, **k):
        r = originals["_decode_run_through"](self, *a, **k)
        if r is not None:
            counts["through"] += 1
            counts["segments"] += len(r.parts)
            counts["finished_in_through"] += sum(len(p.finished) for p in r.parts)
            assert r.columns is not None and len(r.columns["start_s"]) == len(r.starts) - 1
        return r

    def counting_opener(self, *a, **k):
        r = originals["_prompt_then_run"](self, *a, **k)
        if r is not None:
            counts["prompt_runs"] += 1
            counts["prompt_alone"] += not r.parts
        return r
    wrappers = {"decode_run": counting_run, "schedule": counting_schedule,
                "_decode_run_through": counting_through, "_prompt_then_run": counting_opener}
    for name, f in wrappers.items():
        setattr(cls, name, f)
    try:
        with _lookahead(spans):
            res = run(build_config(None, [*overrides, "engine.advance=event"]))
    finally:
        sched_mod.span_run = span_run
        for name, f in originals.items():
            setattr(cls, name, f)
    counts["finished"] = res.summary["requests"]["finished"]
    return counts


LIGHT = ["engine.enable_prefix_caching=false", "workload.num_requests=60", "model=llama-2-7b",
         "gpu=a100-80gb", "engine.max_num_batched_tokens=4096",
         "workload.output_tokens={dist: lognormal, mean: 60, cv: 1.0, max: 400}"]


@pytest.mark.parametrize("mode,share", [
    # prefill-first, light load (W1): the queue is empty at most finishes, runs go on past them
    (["engine.enable_chunked_prefill=false", "workload.arrival.rate=2.0"], 0.7),
    # chunked prefill, synchronous
    (["engine.async_scheduling=false", "engine.max_num_batched_tokens=512",
      "workload.arrival.rate=2.0"], 0.7),
    # saturated, a small pool: preemptions, and runs that end at their first finishing step
    (["engine.enable_chunked_prefill=false", "workload.arrival.rate=40",
      "engine.num_gpu_blocks_override=300"], 0.25),
    # static batching: a finish admits nobody, runs go on with a waiting queue
    (["engine.scheduler=static", "engine.enable_chunked_prefill=false", "workload.arrival.rate=20"], 0.7),
    # contiguous reservations: a finish frees a region (the gauges, the fragmentation)
    (["engine.kv_allocator=contiguous", "engine.enable_chunked_prefill=false",
      "workload.arrival.rate=5", "engine.queue_policy=priority"], 0.7),
    # three replicas, a router reading their state at each arrival
    (["engine.enable_chunked_prefill=false", "workload.arrival.rate=6", "cluster.replicas=3",
      "cluster.router=least_outstanding"], 0.6),
    # async scheduling (vLLM 0.33's default): a finishing turn skips those whose last token is
    # in flight and frees them a step late
    (["engine.async_scheduling=true", "engine.max_num_batched_tokens=512", "workload.arrival.rate=2.0"],
     0.7),
    # async, saturated, a small pool: runs end at their finishing turn with a waiting queue
    (["engine.async_scheduling=true", "engine.max_num_batched_tokens=512", "workload.arrival.rate=20",
      "engine.num_gpu_blocks_override=300"], 0.1),
    # async, three replicas
    (["engine.async_scheduling=true", "engine.max_num_batched_tokens=512", "workload.arrival.rate=6",
      "cluster.replicas=3", "cluster.router=kv_aware"], 0.5),
    # arrivals rejected (too long) during a run's last step: they end after the run's finishes
    (["engine.enable_chunked_prefill=false", "workload.arrival.rate=2.0", "engine.max_model_len=1024",
      "engine.max_num_batched_tokens=1024", "workload.prompt_tokens.mean=500"], 0.7),
    (["engine.async_scheduling=true", "engine.max_num_batched_tokens=512", "workload.arrival.rate=2.0",
      "engine.max_model_len=1024", "workload.prompt_tokens.mean=500"], 0.7),
    # P/D: a decode replica's run ends at its first finishing step (the pull queue watches)
    (["cluster.mode=disaggregated", "workload.arrival.rate=8"], 0.4),
])
def test_finishes_inside_decode_runs(mode, share):
    """A request whose last token comes in a decode run leaves inside it (its blocks freed in
    commit's order and popped by the next steps): byte-identical outputs and step traces, and a
    good share of the finishes happen inside runs."""
    overrides = [*LIGHT, *mode]
    _same_as_step(overrides)
    counts = _run_counting(overrides)
    assert counts["finished_in_runs"] >= share * counts["finished"], counts


def test_pd_decode_runs_end_before_the_other_decode_replicas_steps():
    """P/D with two decode replicas and a small pool (preemptions): one decode replica's step
    end may pull a request whose landing frees a prefill leg's blocks, whose prefill step then
    finishes a leg the decode router sends to the other replica, inside that one's run. Runs
    end before the other decode replicas' step ends (disagg._DecodeReplicaClock): event and
    step give the same outputs (they differed, 2 decode replicas only: an independent review's
    random search). The bound is conservative: with two busy decode replicas few runs remain
    (187 runs beside 11,471 loop steps here)."""
    overrides = ["engine.max_model_len=4096", "engine.enable_prefix_caching=false",
                 "engine.num_gpu_blocks_override=300", "cluster.mode=disaggregated",
                 "cluster.decode.replicas=2", "workload.num_requests=300"]
    _same_as_step(overrides)
    assert _run_counting(overrides)["runs"] > 0


@pytest.mark.parametrize("mode", [
    ["engine.enable_chunked_prefill=false"],
    ["engine.async_scheduling=false", "engine.max_num_batched_tokens=512"],
    ["engine.kv_allocator=contiguous", "engine.enable_chunked_prefill=false"],
])
def test_runs_go_on_while_the_queue_head_cannot_be_admitted(mode):
    """Saturated (W3-like), a small pool: the fcfs head waits for KV room; a batch of decodes
    with such a queue decodes again (arrivals join the tail, free blocks only fall), so the
    loop takes about one step per request (its admission), plus the preempting steps."""
    overrides = [*LIGHT, *mode, "workload.arrival.rate=40", "engine.num_gpu_blocks_override=400",
                 "workload.num_requests=100"]
    trace_s = _same_as_step(overrides)
    counts = _run_counting(overrides)
    trace_steps = len(trace_s)
    admissions = sum(1 for r in trace_s if r["admitted"])
    preempting = sum(1 for r in trace_s if r["preempted"])
    assert counts["loop"] <= admissions + preempting + 0.2 * counts["finished"], (counts, trace_steps)


@pytest.mark.parametrize("mode", [["engine.enable_chunked_prefill=false"],
                                  ["engine.async_scheduling=false", "engine.max_num_batched_tokens=512"]])
def test_one_replica_runs_take_the_step_an_arrival_comes_in(mode):
    """One replica at light load: a run's last step may be the one during which the next
    request arrives (it only joins the queue), so the loop takes about one step per request
    (its admission), not three (admission, finish, the step the arrival came in)."""
    overrides = [*LIGHT, *mode, "workload.arrival.rate=1.0"]
    _same_as_step(overrides)
    counts = _run_counting(overrides)
    assert counts["loop"] <= 1.3 * counts["finished"], counts


@pytest.mark.parametrize("mode", [
    # W1-like: light load, one replica; prompts of ~1,000-3,000 tokens, the next arrival often
    # during a prompt step
    ["workload.arrival.rate=1.0", "workload.prompt_tokens={dist: lognormal, mean: 1500, cv: 0.6, max: 3000}"],
    # a small pool: a run through finishes stops where the free queue runs out, a prompt that
    # does not fit is left to the loop (preemptions there)
    ["workload.arrival.rate=8", "engine.num_gpu_blocks_override=300"],
    # static batching: runs go past finishes with a waiting queue, no prompt step opens a run
    ["engine.scheduler=static", "workload.arrival.rate=20"],
    # contiguous reservations: a finish frees a region, not room a run takes (decode_run_frees
    # False): runs go part by part, the loop takes each admission
    ["engine.kv_allocator=contiguous", "workload.arrival.rate=2.0"],
])
def test_runs_through_finishes_and_prompt_openers(mode):
    """Sync prefill-first runs that go past finishes in one pass (_decode_run_through) and open
    with the prompt step of the request that just arrived (_prompt_then_run): byte-identical
    outputs and step traces against the step loop, and the one-pass paths are the ones taken
    (a run through several finishes, admissions in runs) where they apply."""
    overrides = [*LIGHT, "engine.enable_chunked_prefill=false", *mode]
    trace_s = _same_as_step(overrides)
    counts = _run_counting(overrides)
    if "engine.kv_allocator=contiguous" in mode:
        assert counts["through"] == counts["prompt_runs"] == 0, counts
        return
    assert counts["through"] > 0 and counts["finished_in_through"] >= 0.5 * counts["finished"], counts
    assert counts["segments"] > counts["through"], counts  # some went on past a finish
    admissions = sum(1 for r in trace_s if r["admitted"])
    if "engine.scheduler=static" in mode:
        assert counts["prompt_runs"] == 0, counts
    else:
        assert counts["prompt_runs"] >= 0.5 * admissions, (counts, admissions)
    if "workload.arrival.rate=1.0" in mode:
        assert counts["prompt_alone"] > 0, counts  # an arrival during the prompt step


W4 = ["model=llama-2-7b", "gpu=a100-80gb", "engine.enable_chunked_prefill=false",
      "engine.enable_prefix_caching=false", "engine.max_num_batched_tokens=4096",
      "engine.max_model_len=4096", "workload.num_requests=200",
      "workload.prompt_tokens={dist: lognormal, mean: 1500, cv: 0.8, max: 3500}",
      "workload.output_tokens={dist: lognormal, mean: 150, cv: 1.0, max: 500}"]


@pytest.mark.parametrize("mode", [
    # W4's load: spans admit most arrivals themselves
    ["workload.arrival.rate=1.4"],
    # light: the batch often empties before the next arrival (a span ends, the replica idles)
    ["workload.arrival.rate=0.3"],
    # heavy: arrivals during prompt steps (prompt steps back to back) and two in one step
    ["workload.arrival.rate=6"],
    # a small pool: prompts that do not fit, needs the free queue cannot give (preemptions)
    ["workload.arrival.rate=2", "engine.num_gpu_blocks_override=500"],
    # requests the replica rejects at arrival (prompt + output > max_model_len): a span ends
    # before one
    ["workload.arrival.rate=1.4", "engine.max_model_len=1200"],
    # the sequence cap: a prompt step may not admit past max_num_seqs
    ["workload.arrival.rate=3", "engine.max_num_seqs=4"],
    # a span cut where the free queue runs out, the next request arriving during its last step
    ["workload.arrival.rate=2", "engine.num_gpu_blocks_override=300", "seed=1",
     "workload.output_tokens={dist: uniform, low: 200, high: 600}", "workload.num_requests=120"],
])
def test_spans_admit_the_arrivals_ahead(mode):
    """A replica alone, sync prefill-first: runs admit the arrivals ahead themselves
    (scheduling/span.py), with outputs byte-identical to the step loop's; the spans are taken
    (where the load allows, most arrivals are admitted by a span, not submitted by the feed)."""
    overrides = [*W4, *mode]
    with tempfile.TemporaryDirectory() as tmp:
        step, trace_s = _outputs(overrides, "step", Path(tmp) / "s")
        event, trace_e = _outputs(overrides, "event", Path(tmp) / "e")
    for name in step:
        assert event[name] == step[name], (name, mode)
    assert trace_e == trace_s, mode
    counts = _run_counting(overrides, spans=True)
    assert counts["spans"] > 0, counts
    if mode == ["workload.arrival.rate=1.4"]:
        assert counts["span_taken"] >= 0.5 * 200, counts


@pytest.mark.parametrize("kind", ["decode", "prompt"])
def test_a_span_ends_before_an_arrival_landing_on_a_step_end(tmp_path, kind):
    """An arrival whose SimPy time lands exactly on a step's end: SimPy runs the feed first
    there (its timeout is the older), so the loop's next step is that request's prompt. A span
    treats it as a tie and ends before, as step by step:
    - `decode`: the landing (the feed's timeout: last + (t - last)) is an ulp off the arrival's
      time t, on a decode step's end. (Found in review: a span that compared with t straddled
      the step and ran the replica first.)
    - `prompt`: the arrival comes exactly at the end of an admitted request's prompt step (the
      span's check that a prompt step does not end at the next arrival)."""
    base = ["model=llama-2-7b", "gpu=a100-80gb", "engine.enable_chunked_prefill=false",
            "engine.enable_prefix_caching=false", "engine.max_num_batched_tokens=4096",
            "workload.format=vidur"]

    def write(path: Path, rows: list) -> Path:
        path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                        + "".join(f"{a!r},{p},{o}\n" for a, p, o in rows))
        return path
    first = 0.3
    pre = [(0.0, 500, 1500), (first, 100, 1500)]
    res = run(build_config(None, [*base, f"workload.trace={write(tmp_path / 'pre.csv', pre)}",
                                  "engine.advance=step"]))
    steps = res.iterations
    starts = steps["start_s"].to_numpy()
    ends = starts[1:].tolist()
    if kind == "decode":  # a step end E with a time t just below it whose landing after `first` is E
        end, t = next((e, t) for r, e in enumerate(ends[:-1]) if 0.7 < e < 5
                      and (t := math.nextafter(e, -math.inf)) > starts[r] and first + (t - first) == e)
    else:  # the end of the second request's prompt step, landing exactly
        row = int(np.flatnonzero(steps["prefill_tokens"].to_numpy() == 100)[0])
        end = t = ends[row]
        assert first + (t - first) == end
    trace = write(tmp_path / "tie.csv", [*pre, (t, 100, 10), (end + 1.0, 100, 10)])
    overrides = [*base, f"workload.trace={trace}"]
    step, trace_s = _outputs(overrides, "step", tmp_path / "s")
    event, trace_e = _outputs(overrides, "event", tmp_path / "e")
    assert event == step
    assert trace_e == trace_s
    assert _run_counting(overrides, spans=True)["spans"] >= 1


def test_spans_stopped_at_max_steps_are_exact(tmp_path, monkeypatch):
    """A span stops after `max_steps` decode steps (it bounds the work of one span, not its
    result): with a small bound the spans stop early and often, and the files are still the
    step loop's."""
    import simulator.engine.scheduling.scheduler as sched_mod
    span_run = sched_mod.span_run
    stopped = []

    def short(s, now, until_s, run_times, max_steps, step_time, ahead):
        run = span_run(s, now, until_s, run_times, 37, step_time, ahead)
        if run is not None:  # (its decode steps)
            stopped.append(int((run.columns["prefill_tokens"] == 0).sum()))
        return run
    monkeypatch.setattr(sched_mod, "span_run", short)
    overrides = [*W4, "workload.arrival.rate=1.4", "workload.num_requests=80"]
    step, trace_s = _outputs(overrides, "step", tmp_path / "s")
    event, trace_e = _outputs(overrides, "event", tmp_path / "e")
    assert event == step
    assert trace_e == trace_s
    assert max(stopped) == 37 and stopped.count(37) >= 10, stopped


span_scenario = st.fixed_dictionaries({
    "rate": st.sampled_from([0.5, 1.4, 3.0, 8.0]),
    "blocks": st.sampled_from([None, 400, 900]),
    "max_num_seqs": st.sampled_from([256, 6]),
    "max_model_len": st.sampled_from([4096, 1500]),
    "output": st.sampled_from(["{dist: lognormal, mean: 150, cv: 1.0, max: 500}",
                               "{dist: uniform, low: 2, high: 40}"]),
    "seed": st.integers(0, 5),
})


def _check_span(s: dict) -> None:
    overrides = [*W4, f"workload.arrival.rate={s['rate']}", f"seed={s['seed']}",
                 f"engine.max_num_seqs={s['max_num_seqs']}", f"engine.max_model_len={s['max_model_len']}",
                 f"workload.output_tokens={s['output']}", "workload.num_requests=120"]
    if s["blocks"] is not None:
        overrides.append(f"engine.num_gpu_blocks_override={s['blocks']}")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            step, trace_s = _outputs(overrides, "step", Path(tmp) / "s")
        except ConfigError:
            return
        event, trace_e = _outputs(overrides, "event", Path(tmp) / "e")
    for name in step:
        assert event[name] == step[name], (name, overrides)
    assert trace_e == trace_s, overrides


test_spans_give_byte_identical_outputs = _over(span_scenario, _check_span, 6)
test_spans_give_byte_identical_outputs_many = pytest.mark.slow(_over(span_scenario, _check_span, 60))


def test_a_traced_empty_step_is_committed_in_the_trace():
    """Async scheduling: a schedule that preempts and runs nothing is traced (it preempted) and
    committed at once; its row must be committed in the trace too, or every later row takes the
    row before it, and a decode run (which pops the one row in flight) shifts the times by one
    step (an independent review's find: traces differed, outputs did not)."""
    trace = _same_as_step([
        "seed=868", "engine.enable_chunked_prefill=true", "engine.max_num_batched_tokens=512",
        "workload.num_requests=25", "workload.arrival.rate=50",
        "workload.output_tokens={dist: lognormal, mean: 2, cv: 1.0, max: 60}",
        "workload.prompt_tokens={dist: lognormal, mean: 500, cv: 1.0, max: 3000}",
        "engine.num_gpu_blocks_override=60", "engine.max_model_len=928",
        "engine.queue_policy=priority", "engine.enable_prefix_caching=false",
        "engine.scheduler_reserve_full_isl=false"])
    empty = [r for r in trace if not r["scheduled"]]
    assert empty and all(r["preempted"] for r in empty)  # the case is exercised
    assert [r["step"] for r in trace] == list(range(len(trace)))


@pytest.mark.parametrize("overrides", [
    ["engine.max_num_batched_tokens=4", "engine.max_model_len=4", "engine.max_num_seqs=8",
     "workload.prompt_tokens={dist: constant, value: 1}",
     "workload.output_tokens={dist: constant, value: 3}", "workload.num_requests=40",
     "workload.arrival.rate=100"],
    ["seed=18", "engine.max_num_batched_tokens=5", "engine.max_model_len=5", "engine.max_num_seqs=7",
     "workload.prompt_tokens={dist: constant, value: 1}",
     "workload.output_tokens={dist: uniform, low: 1, high: 4}", "workload.num_requests=114",
     "workload.arrival.rate=200"],
])
def test_prompt_openers_with_a_budget_below_the_sequence_cap(overrides):
    """More running requests than the token budget holds one token each (max_num_seqs >
    max_num_batched_tokens, allowed where max_model_len fits the budget): the loop decodes only
    the first `budget` of them, so a run may not open with a prompt step that leaves more than
    `budget` decodes (a review's find: the run decoded all of them)."""
    _same_as_step(["engine.enable_chunked_prefill=false", "engine.enable_prefix_caching=false",
                   *overrides])


@pytest.mark.parametrize("mode", [
    ["engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=4096",
     "workload.arrival.rate=1.0"],  # W1-like, sync
    ["engine.async_scheduling=true", "engine.max_num_batched_tokens=512", "workload.arrival.rate=1.0"],
    # a small pool: runs stop where the free queue runs out, preemptions free blocks
    ["engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=4096",
     "engine.num_gpu_blocks_override=300",
     "workload.arrival.rate=20"],
])
def test_decode_runs_take_the_same_block_ids(mode, monkeypatch):
    """The blocks every request holds when it frees them (finish or preemption), in order,
    are the same block ids in the same order step by step and in decode runs (the outputs do
    not show block ids without prefix caching: this is the check that runs pop the free queue
    in the loop's order)."""
    from simulator.engine.kvcache.paged import PagedAllocator

    overrides = [*mode, "engine.enable_prefix_caching=false", "workload.num_requests=60",
                 "model=llama-2-7b", "gpu=a100-80gb"]
    original = PagedAllocator.free
    freed: list[tuple[int, tuple[int, ...]]] = []

    def recording(self, req):
        freed.append((req.req_id, tuple(self.req_to_blocks.get(req.req_id, ()))))
        original(self, req)
    monkeypatch.setattr(PagedAllocator, "free", recording)
    by_mode = {}
    for advance in ("step", "event"):
        freed.clear()
        run(build_config(None, [*overrides, f"engine.advance={advance}"]), keep_iterations=False)
        by_mode[advance] = list(freed)
    assert len(by_mode["step"]) >= 60 and sum(map(len, (b for _, b in by_mode["step"]))) > 60
    assert by_mode["event"] == by_mode["step"]
    monkeypatch.setattr(PagedAllocator, "free", original)
    counts = _run_counting(overrides)
    assert counts["run_steps"] > 0.5 * counts["loop"]  # the runs took most steps (and their blocks)
    if "engine.num_gpu_blocks_override=300" in overrides:  # and the pool ran out: preemptions
        assert len(by_mode["step"]) > counts["finished"]


@pytest.mark.parametrize("model,gpu,tp", [("llama-2-7b", "a100-80gb", 1), ("llama-2-7b", "h100-sxm", 2)])
def test_decode_run_times_equal_step_time(model, gpu, tp):
    """A run's k steps, KV entries (= attention pairs) first + m j: advance's wrapper (the cost
    model's own decode_run_times, computed: no table yet) gives step_time's values."""
    cost = CostModel(get_model(model), get_gpu(gpu), tp)
    rng = np.random.default_rng(0)
    for m in (1, 7, 256, 300):
        for first in rng.integers(0, 10**7, 5).tolist():
            got = decode_run_times(cost, m, first + m, 50)
            want = [cost.step_time(StepShape(m, m, float(e), e))
                    for e in range(first + m, first + m + 50 * m, m)]
            assert got.tolist() == want


def test_decode_run_times_with_a_replaced_step_time():
    """A cost model whose step_time is replaced (P/D's prefill cost, a test's fixed step):
    advance's decode_run_times evaluates that step_time step by step, with the run's shapes."""
    class Fixed(CostModel):
        def step_time(self, shape: StepShape) -> float:
            return 1e-3 * shape.num_tokens + 1e-9 * shape.kv_tokens + (shape.num_prefill_tokens == 0)

    cost = Fixed(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1)
    got = decode_run_times(cost, 4, 1000, 6)
    assert got.tolist() == [1e-3 * 4 + 1e-9 * e + 1 for e in range(1000, 1024, 4)]


def _run_durations(cost: CostModel, m: int, first: int, k: int) -> tuple[list[float], list[float]]:
    """decode_run_times of a run's k steps from KV entries `first` on, and step_time's."""
    kv = np.arange(first, first + m * k, m, dtype=np.int64)
    got = cost.decode_run_times(m, first, k)
    assert len(got) == k
    if not got.flags.owndata:  # a view of a table: read-only
        assert not got.flags.writeable and m in cost._decode_tables
    return (got.tolist(), [cost.step_time(StepShape(m, m, float(e), int(e), m, 0)) for e in kv])


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_decode_run_times_table_equals_step_time(async_scheduling):
    """A run's steps (pairs and KV entries C + m (j + 1)): once a batch size
    has been asked often enough the durations come from a per-size table, element for element
    step_time's; entries beyond the table grow it."""
    cost = CostModel(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1, async_scheduling=async_scheduling)
    for m in (3, 40):
        for ask in range(80):
            got, want = _run_durations(cost, m, 1000 * ask + m, 30)
            assert got == want
        assert m in cost._decode_tables  # built, and used by the last asks
        got, want = _run_durations(cost, m, 10**6, 5)  # beyond the table: it grows
        assert got == want and len(cost._decode_tables[m]) > 10**6 + 5 * m


def test_decode_run_times_table_budget_and_reset(monkeypatch):
    """A table that would pass its size limit is not built (the durations are computed, the
    same values); the cost model's own tables growing drops them (they are rebuilt)."""
    import simulator.engine.costmodel as costmodel

    monkeypatch.setattr(costmodel, "_TABLE_ENTRIES", 1 << 12)
    cost = CostModel(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1)
    for ask in range(80):
        got, want = _run_durations(cost, 5, 100 + 20 * ask, 20)  # tops < 2^11: a table fits
        assert got == want
    assert len(cost._decode_tables[5]) <= 1 << 12
    got, want = _run_durations(cost, 5, 10**5, 20)  # would need > 2^12 entries: computed
    assert got == want and len(cost._decode_tables[5]) <= 1 << 12
    cost.step_time(StepShape(cost._num_rows + 10, 1, 1.0, 1, 1, -1))  # grows the token tables
    assert cost._decode_tables == {}
    assert _run_durations(cost, 5, 100, 20)[0] == _run_durations(cost, 5, 100, 20)[1]


def test_exact_delay_lands_on_the_target():
    rng = np.random.default_rng(1)
    for now, d in zip(rng.uniform(0, 1e5, 2000), rng.uniform(1e-4, 10, 2000)):
        target = float(now) + float(d) + 0.001 * float(d)
        delay = exact_delay(float(now), target)
        assert delay is not None and float(now) + delay == target


def test_record_many_equals_record_steps():
    """Same tables and the same gap chunks (their boundaries feed float sums)."""
    rng = np.random.default_rng(2)
    k = 3000
    a, b = MetricsRecorder(100), MetricsRecorder(100)
    starts = np.cumsum(rng.uniform(0.01, 0.02, k + 1))
    m = 40
    cols = {"start_s": starts[:k], "duration_s": np.diff(starts), "num_seqs": np.full(k, m),
            "num_tokens": np.full(k, m), "prefill_tokens": np.zeros(k, np.int64),
            "decode_tokens": np.full(k, m), "num_preempted": np.zeros(k, np.int64),
            "num_admitted": np.zeros(k, np.int64), "num_running": np.full(k, m),
            "num_waiting": np.full(k, 3), "kv_used_slots": np.arange(k) * 16,
            "kv_usage": np.arange(k) / k, "kv_tokens_stored": np.arange(k) * 15,
            "num_sampled": np.full(k, m), "prefix_queries_total": None, "prefix_hits_total": None,
            "evictions_total": None, "swap_s": np.zeros(k), "kv_external_frag_slots": None}
    gaps = rng.uniform(0, 1, k * m).round(3)
    a.record(StepRecord(0.0, 0.01, 1, 5, 5, 0, 0, 1, 1, 0, 16, 0.1, 5, 1, swap_s=0.0,
                        token_gaps=rng.uniform(0, 1, 30000)))
    b.record(StepRecord(0.0, 0.01, 1, 5, 5, 0, 0, 1, 1, 0, 16, 0.1, 5, 1, swap_s=0.0,
                        token_gaps=a._gap_buffer[0]))
    a.record_many(cols, gaps, np.full(k, m))
    for j in range(k):
        b.record(StepRecord(*(cols[c][j].item() for c in list(cols)[:14]), swap_s=0.0,
                            token_gaps=gaps[j * m:(j + 1) * m]))
    assert a.iterations_frame().equals(b.iterations_frame())
    assert [len(v) for v in a._gap_values] == [len(v) for v in b._gap_values]
    for x, y in zip(a.token_gaps(), b.token_gaps()):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("seed", range(3))
def test_few_block_events_are_the_grids(seed):
    """A run through finishes finds the block events of a few requests in Python
    (scheduler._few_block_events): the same (slot, step) arrays, in (step, slot) order, as
    _decode_block_events' numpy grid, for any capacities, horizons and block sizes."""
    from helpers import make_scheduler

    from simulator.engine.scheduling.scheduler import _few_block_events
    from simulator.workload.request import Request

    rng = np.random.default_rng(seed)
    for _ in range(300):
        bs = int(rng.choice([1, 2, 4, 16]))
        m = int(rng.integers(1, 9))
        sched = make_scheduler(num_blocks=4096, block_size=bs, max_num_seqs=16)
        rb = sched.running
        computed = rng.integers(1, 200, m)
        capacity = (-(-computed // bs) + rng.integers(0, 2, m)) * bs  # >= computed, whole blocks
        left = rng.integers(1, 60, m)
        for i in range(m):
            rb.append(Request(i, 0.0, 10, 10), int(computed[i]), int(capacity[i]))
        horizon = int(rng.integers(1, 70))
        _, want_i, want_j = sched._decode_block_events(horizon, None, np.minimum(left, horizon))
        got_i, got_j = _few_block_events(left.tolist(), computed.tolist(), capacity.tolist(),
                                         horizon, bs)
        assert got_i.dtype == want_i.dtype == np.int64
        assert got_i.tolist() == want_i.tolist() and got_j.tolist() == want_j.tolist()
