"""vLLM's own v1 scheduler as a kvsim backend (`engine.backend: vllm`).

vLLM's `Scheduler`, `KVCacheManager` and `BlockPool` are pure Python; here they run inside
kvsim's SimPy loop with no GPU, weights or tokenizer (install: docs/parity.md). `VllmScheduler`
implements kvsim's protocols.SchedulerInterface (`add_request`, `schedule(now) -> Batch`,
`commit(now) -> finished`, `stats()`), and `VllmKV` the KVCacheView of vLLM's block pool, so
step durations come from kvsim's cost model over the same StepShape and the same StepRecords
reach the metrics recorder. `VllmBackend` is registered lazily in engine/build.py (BACKENDS), so
the engine layer never imports this module.

Token identity (what vLLM's sha256 block hashes see) follows kvsim's prefix contract
(kvcache/prefix.py): token t of a request is *shared content* (chunk id, offset) when kvsim's
BlockHasher treats it as shared, else unique to the request. Shared content maps to one token
id per (chunk id, offset), unique tokens to ids drawn from a per-run counter, so two requests
share a vLLM block exactly when they share the kvsim block. Output tokens fed back as the fake
model output use the same map (a session's answer can be shared with its next turn).

One step (sync `Scheduler`):
1. `schedule()`; its per-request tokens, preemptions and admissions (with their prefix-hit
   tokens) are read back and summarised as a kvsim Batch;
2. after the step's simulated duration, `commit` feeds a ModelRunnerOutput with one sampled
   token for each request whose prefill is complete (none for a partial chunk) to
   `update_from_output`, and applies first-token / inter-token / finish events to kvsim's
   Request objects.
With `async_scheduling` (vLLM's `AsyncScheduler`) the replica loop keeps two batches in flight
as vLLM's EngineCore.step_with_batch_queue does: step n+1's `schedule()` runs before step n's
`update_from_output`, so `commit` feeds the oldest scheduled step (a FIFO of scheduler outputs).
"""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from collections import deque
from pathlib import Path

import numpy as np

from simulator.config.schema import resolve_async_scheduling
from simulator.engine.cluster import resolve_cluster
from simulator.engine.costmodel import StepShape
from simulator.engine.protocols import Batch, KVStats, SchedulerInterface, SchedulerStats
from simulator.errors import ConfigError
from simulator.workload.request import Request, Status

VLLM_VERSION = "0.33.0"  # the vLLM release this backend was verified against (step parity)
INSTALL_HINT = ("the vllm backend needs vLLM's scheduler: install the extra with "
                "`pip install torch==2.13.0 && pip install --no-deps vllm==0.33.0 && "
                "pip install 'kvsim[vllm]' && pip install --no-deps xgrammar==0.2.8 "
                "apache-tvm-ffi==0.1.11` (CPU-only steps in docs/parity.md)")
UNIQUE_BASE = 1 << 30  # unique token ids start here; shared-content ids stay below


def import_vllm():
    """The vllm module, or a ConfigError with one line saying how to install the extra."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm  # noqa: F401
        from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"{INSTALL_HINT} (import failed: {e})") from None
    return vllm


def vllm_version() -> str | None:
    """Installed vLLM version, None when absent (no import of vllm itself)."""
    try:
        from importlib.metadata import version
        return version("vllm")
    except Exception:
        return None


def backend_info() -> dict[str, str]:
    """What a vllm-backend run prints and records: the backend and vLLM's version."""
    return {"backend": "vllm", "vllm_version": vllm_version() or "missing",
            "vllm_verified_version": VLLM_VERSION}


def check_supported(engine) -> None:
    """ConfigError for engine settings vLLM v1's scheduler does not have."""
    rules = [
        (engine.kv_allocator == "paged", f"engine.kv_allocator {engine.kv_allocator!r}: the vllm "
         f"backend has only vLLM's paged block pool; use kv_allocator: paged"),
        (engine.scheduler == "continuous", f"engine.scheduler {engine.scheduler!r}: vLLM v1 "
         f"batches continuously; use scheduler: continuous"),
        (engine.queue_policy in ("fcfs", "priority"), f"engine.queue_policy "
         f"{engine.queue_policy!r}: vLLM has fcfs and priority"),
        (engine.enable_chunked_prefill, "engine.enable_chunked_prefill false: vLLM v1 always "
         "chunks prefills"),
        (engine.preemption_mode == "recompute", f"engine.preemption_mode "
         f"{engine.preemption_mode!r}: vLLM v1 preempts by recompute only"),
        (engine.eviction_policy == "lru", f"engine.eviction_policy {engine.eviction_policy!r}: "
         f"vLLM's block pool evicts in free-queue (lru) order only"),
    ]
    for ok, message in rules:
        if not ok:
            raise ConfigError(f"unsupported with engine.backend vllm: {message}")


class TokenIds:
    """Deterministic token ids that reproduce kvsim's block identities (module docstring)."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self._chunk_index: dict[int, int] = {}  # chunk id -> dense index, first-seen order
        self._next_unique = UNIQUE_BASE
        self._unique_base: dict[int, int] = {}

    def shared_tokens(self, req: Request) -> int:
        """Leading tokens of req's stream that are shared content (BlockHasher's rule)."""
        prefix = req.prefix
        if prefix is None:
            return 0
        c = self.chunk_tokens
        covered = len(prefix) * c
        limit = req.prompt_tokens if covered <= -(-req.prompt_tokens // c) * c else \
            req.prompt_tokens + req.output_tokens
        return min(covered, limit)

    def ids(self, req: Request, start: int, end: int) -> list[int]:
        """Token ids of positions [start, end) of req's stream (prompt, then output)."""
        base = self._unique_base.get(req.req_id)
        if base is None:
            base = self._unique_base[req.req_id] = self._next_unique
            self._next_unique += req.prompt_tokens + req.output_tokens
        shared = self.shared_tokens(req)
        c = self.chunk_tokens
        out = []
        for t in range(start, end):
            if t < shared:
                chunk = int(req.prefix[t // c])
                k = self._chunk_index.get(chunk)
                if k is None:
                    k = self._chunk_index[chunk] = len(self._chunk_index)
                out.append(1 + k * c + t % c)
            else:
                out.append(base + t)
        return out

    def forget(self, req_id: int) -> None:
        self._unique_base.pop(req_id, None)


_MODEL_DIR: dict[int, str] = {}


def _model_dir(max_model_len: int) -> str:
    """A directory holding only a small Llama-style config.json (vLLM inspects no weights)."""
    path = _MODEL_DIR.get(max_model_len)
    if path is None:
        path = tempfile.mkdtemp(prefix="kvsim-vllm-model-")
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                  "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 32000,
                  "max_position_embeddings": max_model_len, "torch_dtype": "float16",
                  "rms_norm_eps": 1e-5}
        (Path(path) / "config.json").write_text(json.dumps(config))
        _MODEL_DIR[max_model_len] = path
    return path


def build_vllm_scheduler(*, num_blocks: int, block_size: int, max_num_seqs: int,
                         max_num_batched_tokens: int, max_model_len: int, policy: str,
                         enable_prefix_caching: bool, async_scheduling: bool = False,
                         reserve_full_isl: bool = True):
    """vLLM's scheduler (sync or async) over a KV pool of num_blocks blocks (block 0 null)."""
    import_vllm()
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=_model_dir(max_model_len), skip_tokenizer_init=True,
                               dtype="float16", max_model_len=max_model_len)
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                       max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=max_model_len, enable_chunked_prefill=True,
                                       is_encoder_decoder=False, policy=policy,
                                       async_scheduling=async_scheduling,
                                       scheduler_reserve_full_isl=reserve_full_isl)
    cache_config = CacheConfig(block_size=block_size, cache_dtype="auto",
                               enable_prefix_caching=enable_prefix_caching)
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    import torch
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=4, head_size=16,
                             dtype=torch.float16)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    cache_config.num_gpu_blocks = num_blocks
    cls = scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=block_size, log_stats=True)


class VllmKV:
    """kvsim's KVCacheView of vLLM's block pool: the gauges and counters Replica and the
    recorder read (vLLM's own scheduler allocates; nobody else does here)."""

    def __init__(self, vs, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self._pool = vs.kv_cache_manager.block_pool
        self._vs = vs
        # Eviction statistics as kvsim's BlockPool keeps them (count, and idle time since the
        # block's last allocation or hit), from hooks on vLLM's pool that change no decision.
        self.now = 0.0
        self.num_evictions = 0
        self.evicted_idle_s = array("d")
        last_access = [0.0] * num_blocks
        pool = self._pool
        evict, get_new, touch = pool._maybe_evict_cached_block, pool.get_new_blocks, pool.touch

        def counted_evict(block) -> bool:
            evicted = evict(block)
            if evicted:
                self.num_evictions += 1
                self.evicted_idle_s.append(self.now - last_access[block.block_id])
            return evicted

        def stamped_get_new(num_blocks):
            blocks = get_new(num_blocks)
            for b in blocks:
                last_access[b.block_id] = self.now
            return blocks

        def stamped_touch(blocks):
            touch(blocks)
            for b in blocks:
                last_access[b.block_id] = self.now

        pool._maybe_evict_cached_block = counted_evict
        pool.get_new_blocks = stamped_get_new
        pool.touch = stamped_touch
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.total_slots = (num_blocks - 1) * block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_queries = 0
        self.prefix_hits = 0

    def max_request_slots(self, req: Request) -> int:
        return -(-req.final_kv_tokens // self.block_size) * self.block_size

    def lookup_prefix(self, req: Request) -> int:
        # vLLM's lookup (get_computed_blocks) records prefix-cache stats: asking every replica
        # would change the counters the parity checks compare (VllmBackend.check refuses the
        # one router that asks)
        raise NotImplementedError("vLLM's prefix cache is not queried without side effects")

    def stats(self) -> KVStats:
        used = (self.num_blocks - 1 - self._pool.get_num_free_blocks()) * self.block_size
        usage = float(self._vs.get_kv_cache_usage())
        if not self.enable_prefix_caching:
            return KVStats(used, usage)
        return KVStats(used, usage, self.prefix_queries, self.prefix_hits, self.num_evictions,
                       self.evicted_idle_s)


class VllmScheduler:
    """protocols.SchedulerInterface over vLLM's v1 scheduler (module docstring)."""

    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, policy: str = "fcfs",
                 enable_prefix_caching: bool = False, chunk_tokens: int = 512,
                 async_scheduling: bool = False, reserve_full_isl: bool = True) -> None:
        import_vllm()
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request as VRequest

        self._VRequest, self._SamplingParams, self._MRO = VRequest, SamplingParams, ModelRunnerOutput
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(block_size, sha256)
        self.vs = build_vllm_scheduler(num_blocks=num_blocks, block_size=block_size,
                                       max_num_seqs=max_num_seqs,
                                       max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=max_model_len, policy=policy,
                                       enable_prefix_caching=enable_prefix_caching,
                                       async_scheduling=async_scheduling,
                                       reserve_full_isl=reserve_full_isl)
        self.async_scheduling = async_scheduling
        # scheduled steps awaiting update_from_output, oldest first (two under async)
        self._steps: deque[tuple[object, list[str]]] = deque()
        self.kv = VllmKV(self.vs, num_blocks, block_size, enable_prefix_caching)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.tokens = TokenIds(chunk_tokens)
        self.reqs: dict[str, Request] = {}
        self.num_preemptions = 0
        self._gaps: np.ndarray | None = None  # inter-token gaps of the last commit
        self._scheduled: dict[int, int] = {}
        self._running_ids: set[str] = set()

    # --- queue side ----------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        req.status = Status.WAITING
        # zero-padded: vLLM breaks priority ties by comparing request_id strings
        rid = f"{req.req_id:010d}"
        self.reqs[rid] = req
        vreq = self._VRequest(
            request_id=rid, prompt_token_ids=self.tokens.ids(req, 0, req.prompt_tokens),
            sampling_params=self._SamplingParams(max_tokens=req.output_tokens, ignore_eos=True),
            pooling_params=None, arrival_time=req.arrival_s, priority=req.priority,
            block_hasher=self._hasher)
        self.vs.add_request(vreq)

    @property
    def has_work(self) -> bool:
        return bool(self.vs.running or self.vs.waiting)

    # --- one step ------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch:
        vs = self.vs
        self.kv.now = now
        out = vs.schedule()
        requests = vs.requests
        scheduled = out.num_scheduled_tokens
        n = np.fromiter(scheduled.values(), np.int64, len(scheduled))
        # vLLM advances num_computed_tokens inside schedule(); the step started from c
        c = np.fromiter((requests[r].num_computed_tokens for r in scheduled), np.int64, len(scheduled))
        c -= n
        # samples this step: not a partial prefill chunk (vLLM's is_prefill_chunk, set in
        # schedule(); under async num_tokens + num_output_placeholders is the target)
        sampled = np.fromiter((not requests[r].is_prefill_chunk for r in scheduled), bool,
                              len(scheduled))
        # outputs before this step, placeholders of steps in flight included (a decode whose
        # first token is still in flight is a decode, as kvsim counts it)
        num_out = np.fromiter((requests[r].num_output_tokens + requests[r].num_output_placeholders
                               for r in scheduled), np.int64, len(scheduled))
        num_out -= sampled & self.async_scheduling
        reach = c + n
        decodes = int(np.count_nonzero(sampled & (n == 1) & (num_out > 0)))
        t = int(n.sum())
        shape = StepShape(num_tokens=t, num_sampled=int(np.count_nonzero(sampled)),
                          attn_pairs=float(n @ c) + float(n @ (n + 1)) / 2.0,
                          kv_tokens=int(reach.sum()), num_seqs=len(scheduled),
                          num_prefill_tokens=t - decodes)
        # preempted: were running, now waiting (recompute: computed reset)
        running_now = {r.request_id for r in vs.running}
        preempted = [self.reqs[r] for r in sorted(self._running_ids - running_now, key=int)
                     if r in requests]
        for req in preempted:
            req.num_preemptions += 1
            req.status = Status.PREEMPTED
            req.num_computed_tokens = 0
        self.num_preemptions += len(preempted)
        admitted = []
        for vreq in vs.running:
            rid = vreq.request_id
            if rid not in self._running_ids:
                req = self.reqs[rid]
                hit = vreq.num_computed_tokens - scheduled.get(rid, 0)
                admitted.append((req.req_id, hit))
                req.status = Status.RUNNING
                if req.first_scheduled_s < 0:
                    req.first_scheduled_s = now
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = hit
        self._running_ids = running_now
        self._scheduled = {int(r): int(k) for r, k in scheduled.items()}
        self._steps.append((out, [r for r, s in zip(scheduled, sampled.tolist()) if s]))
        return Batch(shape, len(scheduled), t - decodes, decodes, len(preempted), len(admitted),
                     preempted=preempted, admitted=admitted)

    def commit(self, now: float) -> list[Request]:
        """Feed the oldest scheduled step's fake model output to vLLM (update_from_output);
        apply token and finish events. Under async the next step is already scheduled, and a
        request preempted since still gets its (stale) token, as vLLM delivers it."""
        vs = self.vs
        out, step_sampled = self._steps.popleft()
        requests = vs.requests
        req_ids = list(out.num_scheduled_tokens)
        sampled = set(step_sampled)
        token_ids = []
        for r in req_ids:
            if r in sampled:
                pos = self.reqs[r].num_tokens  # the position the sampled token takes
                token_ids.append(self.tokens.ids(self.reqs[r], pos, pos + 1))
            else:
                token_ids.append([])
        mro = self._MRO(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                        sampled_token_ids=token_ids)
        engine_outputs = vs.update_from_output(out, mro)
        self._take_prefix_stats(engine_outputs)
        gaps = []
        finished: list[Request] = []
        for r in step_sampled:
            req = self.reqs[r]
            gap = req.add_output_token(now)
            if gap is not None:
                gaps.append(gap)
            if r not in requests:  # vLLM finished and dropped it
                req.num_computed_tokens = req.prompt_tokens + req.num_output_tokens - 1
                req.finish_s = now
                req.status = Status.FINISHED
                finished.append(req)
                del self.reqs[r]
                self._running_ids.discard(r)
                self.tokens.forget(req.req_id)
        self._gaps = np.asarray(gaps) if gaps else None
        return finished

    def _take_prefix_stats(self, engine_outputs) -> None:
        for eco in (engine_outputs or {}).values():  # EngineCoreOutputs
            stats = eco.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                self.kv.prefix_queries += int(stats.prefix_cache_stats.queries)
                self.kv.prefix_hits += int(stats.prefix_cache_stats.hits)

    def stats(self) -> SchedulerStats:
        vs = self.vs
        stored = int(sum(r.num_computed_tokens for r in vs.running))
        return SchedulerStats(len(vs.running), len(vs.waiting), stored, self.kv.stats(),
                              self.num_preemptions, self._gaps)

    def num_waiting(self) -> int:
        return len(self.vs.waiting)

    def scheduled(self) -> dict[int, int]:
        return dict(self._scheduled)

    def decode_run(self, now: float, until_s: float, run_times, max_steps: int = 4096,
                   inflight_s: float | None = None, straddle: bool = False,
                   step_time=None, ahead=None) -> None:
        """vLLM's scheduler is driven step by step (the reference): no decode runs."""
        return None


class VllmBackend:
    """engine.backend vllm (protocols.Backend): vLLM's scheduler and block pool per replica,
    over kvsim's num_gpu_blocks (memory math or num_gpu_blocks_override)."""

    _async = False  # the run's resolved async_scheduling (set by check, shown by lines)

    def check(self, config) -> None:
        check_supported(config.engine)
        self._async = resolve_async_scheduling(config.engine)
        cluster = resolve_cluster(config.cluster)
        if cluster.replicas > 1 and cluster.router == "prefix_affinity":
            raise ConfigError("unsupported with engine.backend vllm: cluster.router "
                              "prefix_affinity (vLLM's prefix cache cannot be queried without "
                              "changing its counters); use round_robin, least_outstanding or kv_aware")

    def build(self, s, workload, *, vectorized: bool = True) -> SchedulerInterface:
        eng, e = s.config.engine, s.engine
        return VllmScheduler(num_blocks=s.memory.num_gpu_blocks, block_size=e.block_size,
                             max_num_seqs=e.max_num_seqs,
                             max_num_batched_tokens=e.max_num_batched_tokens,
                             max_model_len=e.max_model_len, policy=eng.queue_policy,
                             enable_prefix_caching=eng.enable_prefix_caching,
                             chunk_tokens=workload.prefix_block_tokens,
                             reserve_full_isl=eng.scheduler_reserve_full_isl,
                             async_scheduling=e.async_scheduling)

    def lines(self) -> list[str]:
        info = backend_info()
        return [f"backend: vLLM's own v1 Scheduler, vLLM {info['vllm_version']} (parity verified "
                f"against {info['vllm_verified_version']}), "
                f"{'AsyncScheduler, two batches in flight' if self._async else 'sync'}"]

    def info(self) -> dict[str, str]:
        return backend_info()
