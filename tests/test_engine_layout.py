"""The engine's shape: callers use only the protocols (no probes), the engine layer never
imports a backend, and every plug-in kind has its registry with the built-in names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "simulator"
PROBE = re.compile(r"\b(hasattr|getattr)\(")


def _sources(*parts: str):
    for part in parts:
        yield from sorted((ROOT / part).rglob("*.py"))


def test_no_hasattr_or_getattr_probes_in_the_engine():
    # costmodel.py reads its own dataclass fields by name (not a probe of another object)
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for p in _sources("engine", "backends", "metrics") if p.name != "costmodel.py"
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if PROBE.search(line) and not line.lstrip().startswith(("#", "-", '"'))]
    assert hits == []


def test_engine_never_imports_a_backend():
    imports = re.compile(r"^\s*(from|import)\s+simulator\.backends", re.M)
    assert [p.name for p in _sources("engine") if imports.search(p.read_text())] == []


def test_built_in_plug_ins_are_registered():
    from simulator.engine.build import BACKENDS
    from simulator.engine.kvcache import ALLOCATORS
    from simulator.engine.kvcache.eviction import EVICTION_POLICIES
    from simulator.engine.routers import ROUTERS
    from simulator.engine.scheduling import BATCHING_MODES, QUEUE_POLICIES
    for reg, names in [(ALLOCATORS, {"paged", "contiguous"}),
                       (EVICTION_POLICIES, {"lru", "lru_ttl", "lfu"}),
                       (QUEUE_POLICIES, {"fcfs", "priority", "tiered"}),
                       (BATCHING_MODES, {"continuous", "static"}),
                       (ROUTERS, {"round_robin", "least_outstanding", "kv_aware", "prefix_affinity"}),
                       (BACKENDS, {"kvsim", "vllm"})]:
        assert names <= set(reg.names()), reg.kind


@pytest.mark.parametrize("package", ["engine", "engine/kvcache", "engine/kvcache/eviction",
                                     "engine/scheduling", "engine/scheduling/queues",
                                     "engine/routers"])
def test_each_subpackage_says_what_it_holds(package):
    import ast
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text()))
    assert doc and len(doc.splitlines()) == 2, doc


def _members(proto) -> set[str]:
    names = set()
    for klass in proto.__mro__:
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_") or n in ("__len__", "__contains__")}
        names |= set(getattr(klass, "__annotations__", {}))
    return names - {"_is_protocol", "_is_runtime_protocol"}


def test_implementations_have_every_protocol_member():
    """A structural check of the built-ins against protocols.py (what a type checker would say)."""
    from helpers import make_scheduler

    from simulator.engine import protocols as p
    from simulator.engine.kvcache import BlockPool, ContiguousAllocator, PagedAllocator
    from simulator.engine.kvcache.eviction import EVICTION_POLICIES
    from simulator.engine.protocols import QueueContext, RouterContext
    from simulator.engine.routers import ROUTERS
    from simulator.engine.scheduling import BATCHING_MODES, QUEUE_POLICIES

    sched = make_scheduler()
    # NOTE: a policy runs on a BlockPool only (make_block_pool); the scheduler's default pool here
    # is the unhashed one (no prefix caching), which has no policy and keeps no access times
    pool = BlockPool(3)
    queue_params = {"tiered": {"tiers": [{"max_prompt_tokens": 8, "max_seq_share": 0.5}, {}]}}
    cases = [(p.KVCacheManager, PagedAllocator(5, 4)), (p.KVCacheManager, ContiguousAllocator(64, "oracle")),
             (p.SchedulerInterface, sched)]
    cases += [(p.EvictionPolicy, EVICTION_POLICIES.build(n, {}, "", pool, range(1, 3)))
              for n in ("lru", "lru_ttl", "lfu")]
    cases += [(p.QueuePolicy, QUEUE_POLICIES.build(n, queue_params.get(n), "", QueueContext(4, 64)))
              for n in ("fcfs", "priority", "tiered")]
    cases += [(p.BatchingMode, BATCHING_MODES.get(n)()) for n in ("continuous", "static")]
    cases += [(p.Router, ROUTERS.build(n, {}, "", RouterContext(2, True, 16)))
              for n in ("round_robin", "least_outstanding", "kv_aware", "prefix_affinity")]
    for proto, obj in cases:
        missing = sorted(m for m in _members(proto) if not hasattr(obj, m))
        assert missing == [], (proto.__name__, type(obj).__name__)
