"""Host-side cost of vLLM's own v1 scheduler per step, measured on this machine: the source of
`StepOverhead.cpu_per_seq_s` and `cpu_per_token_s` (simulator/engine/costmodel.py).

    python -m simulator.calibration.host_probe        # needs the vllm extra (docs/parity.md)

Steps: 1. build vLLM's Scheduler as the vllm backend does (no GPU, no weights); 2. for each batch
size B, add B requests of a 256-token prompt, run 60 steps feeding one sampled token per request,
and take the median wall time of Scheduler.schedule and of update_from_output over the last 50;
3. for new prompts of 512-8,192 tokens, time one schedule + update_from_output each; 4. print
the per-request and per-token slopes. The figures depend on the CPU and its load: they are a
measurement of vLLM's code on this host, not of a serving host.
"""

from __future__ import annotations

import os
import time

import numpy as np


def _scheduler(max_model_len: int = 8192):
    from simulator.backends.vllm import build_vllm_scheduler

    return build_vllm_scheduler(num_blocks=20000, block_size=16, max_num_seqs=1024,
                                max_num_batched_tokens=8192, max_model_len=max_model_len, policy="fcfs",
                                enable_prefix_caching=True)


def _output(sched, out, sampled: list[list[int]]):
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[])


def decode_step_seconds(batch: int, steps: int = 60, warmup: int = 10) -> tuple[float, float]:
    """Median seconds of (schedule, update_from_output) with `batch` running decode requests."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sched = _scheduler()
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for i in range(batch):
        sched.add_request(Request(request_id=str(i), prompt_token_ids=list(range(i * 1000, i * 1000 + 256)),
                                  sampling_params=params, pooling_params=None, arrival_time=0.0))
    schedule, update = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_prompt_tokens else []
                   for r in out.num_scheduled_tokens]
        mro = _output(sched, out, sampled)
        t2 = time.perf_counter()
        sched.update_from_output(out, mro)
        t3 = time.perf_counter()
        if k >= warmup:
            schedule.append(t1 - t0)
            update.append(t3 - t2)
    return float(np.median(schedule)), float(np.median(update))


def prompt_seconds(num_tokens: int, reps: int = 15) -> float:
    """Median seconds of schedule + update_from_output for one new prompt of num_tokens."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    times = []
    for k in range(reps):
        sched = _scheduler()
        prompt = list(range(k * 10_000, k * 10_000 + num_tokens))
        sched.add_request(Request(request_id="0", prompt_token_ids=prompt,
                                  sampling_params=SamplingParams(max_tokens=10, ignore_eos=True),
                                  pooling_params=None, arrival_time=0.0))
        t0 = time.perf_counter()
        out = sched.schedule()
        sched.update_from_output(out, _output(sched, out, [[7]]))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sizes = (1, 8, 32, 128, 256)
    rows = {b: decode_step_seconds(b) for b in sizes}
    for b, (s, u) in rows.items():
        print(f"decode batch {b:4d}: schedule {s * 1e6:8.1f} us, update_from_output {u * 1e6:8.1f} us")
    slope = [np.polyfit(sizes, [rows[b][i] for b in sizes], 1)[0] for i in (0, 1)]
    print(f"per running request: schedule {slope[0] * 1e6:.1f} us + update {slope[1] * 1e6:.1f} us")
    lengths = (512, 2048, 8192)
    prompts = [prompt_seconds(n) for n in lengths]
    per_token = np.polyfit(lengths, prompts, 1)[0]
    print(f"per prompt token (new request): {per_token * 1e6:.3f} us")


if __name__ == "__main__":
    main()
