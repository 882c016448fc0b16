"""KV allocators: unit cases and a hypothesis state machine over allocate / free."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simulator.engine.kvcache import ContiguousAllocator, PagedAllocator
from simulator.workload.request import Request


def req(i, prompt=10, out=5):
    return Request(i, 0.0, prompt, out)


def test_paged_allocates_ceil_blocks_and_frees_tail_first():
    kv = PagedAllocator(num_blocks=9, block_size=4)
    r = req(0)
    assert kv.allocate_slots(r, 9, 0) == 12  # 3 blocks
    assert kv.req_to_blocks[0] == [1, 2, 3]
    assert kv.allocate_slots(r, 3, 9) == 12  # fits in held blocks
    assert kv.allocate_slots(r, 1, 12) == 16
    assert kv.stats().usage == 4 / 8 and kv.stats().used_slots == 16
    kv.free(r)
    # freed in reverse, and (no hashes: caching off) to the head of the queue, so the
    # request's last block is reused first (vLLM 0.33 BlockPool.free_blocks: LIFO reuse of
    # uncached blocks)
    assert kv.pool.free_queue.order() == [4, 3, 2, 1, 5, 6, 7, 8]
    assert kv.stats().usage == 0


def test_paged_returns_none_when_full():
    kv = PagedAllocator(num_blocks=3, block_size=4)
    assert kv.allocate_slots(req(0), 8, 0) == 8
    assert kv.allocate_slots(req(1), 1, 0) is None
    assert kv.pool.num_free_blocks == 0


def test_contiguous_first_fit_and_merge():
    kv = ContiguousAllocator(100, reserve="oracle")
    a, b, c = req(0, 20, 10), req(1, 30, 10), req(2, 10, 10)
    assert kv.allocate_slots(a, 20, 0) == 30
    assert kv.allocate_slots(b, 30, 0) == 40
    assert kv.allocate_slots(c, 10, 0) == 20  # regions [0,30) [30,70) [70,90), hole [90,100)
    kv.free(b)
    assert kv.allocate_slots(req(3, 45, 1), 45, 0) is None  # 50 free, largest hole 40
    kv.free(a)  # [0,70) merges
    assert kv.largest_hole == 70 and kv.stats().external_frag_slots == 100 - 20 - 70
    kv.free(c)
    assert (kv._starts, kv._lengths, kv.stats().used_slots) == ([0], [100], 0)


def test_contiguous_reserve_modes():
    r = req(0, 100, 30)  # 130 tokens
    assert ContiguousAllocator(10_000, "max_model_len", 2048).max_request_slots(r) == 2048
    assert ContiguousAllocator(10_000, "pow2").max_request_slots(r) == 256
    assert ContiguousAllocator(10_000, "oracle").max_request_slots(r) == 130


class PagedMachine(RuleBasedStateMachine):
    """Blocks are conserved: free + held (by ref) == pool, tables never point at free blocks."""

    def __init__(self):
        super().__init__()
        self.kv = PagedAllocator(num_blocks=17, block_size=4)
        self.tokens: dict[int, int] = {}
        self.next_id = 0

    @rule(n=st.integers(1, 40))
    def admit(self, n):
        r = req(self.next_id)
        self.next_id += 1
        if self.kv.allocate_slots(r, n, 0) is not None:
            self.tokens[r.req_id] = n

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 8))
    def grow(self, data, n):
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        before = self.kv.pool.num_free_blocks
        cap = self.kv.allocate_slots(req(rid), n, self.tokens[rid])
        if cap is None:
            assert self.kv.pool.num_free_blocks == before  # a failed allocation takes nothing
        else:
            self.tokens[rid] += n
            assert cap >= self.tokens[rid]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.kv.free(req(rid))
        del self.tokens[rid]

    @invariant()
    def conserved(self):
        held = [b for blocks in self.kv.req_to_blocks.values() for b in blocks]
        free = set(self.kv.pool.free_queue.order())
        assert len(held) == len(set(held))  # no block in two tables (no sharing without caching)
        assert not free & set(held)
        assert len(free) + len(held) == self.kv.pool.num_blocks - 1
        assert len(free) == len(self.kv.pool.free_queue)  # no block free twice
        for rid, t in self.tokens.items():
            assert len(self.kv.req_to_blocks[rid]) == -(-t // 4)


TestPagedMachine = PagedMachine.TestCase
TestPagedMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_unhashed_pool_pops_and_frees_in_lru_order():
    """The list-backed pool (no prefix caching) hands out exactly BlockPool(lru)'s ids."""
    import random

    from simulator.engine.kvcache.block_pool import BlockPool, UnhashedBlockPool
    rng = random.Random(7)
    ref, fast = BlockPool(41, "lru"), UnhashedBlockPool(41)
    held: list[list[int]] = []
    for _ in range(600):
        r = rng.random()
        if held and (r < 0.4 or ref.num_free_blocks == 0):
            blocks = held.pop(rng.randrange(len(held)))
            ref.free_blocks(blocks[::-1])
            if rng.random() < 0.5:  # a request's table (PagedAllocator.free)
                fast.free_table(blocks)
            else:
                fast.free_blocks(blocks[::-1])
        elif held and r < 0.6:  # a table grows at its end (decoding, later chunks)
            blocks = held[rng.randrange(len(held))]
            n = rng.choice([0, 1, rng.randint(0, ref.num_free_blocks)])
            a, b = ref.get_new_blocks(n), fast.get_new_blocks(n)
            assert a == b
            blocks += a
        else:
            n = rng.choice([0, 1, rng.randint(0, ref.num_free_blocks)])
            a, b = ref.get_new_blocks(n), fast.get_new_blocks(n)
            assert a == b
            held.append(a)
        assert ref.free_queue.order() == fast.free_queue.order()
        assert ref.num_free_blocks == fast.num_free_blocks
    with pytest.raises(ValueError, match="asked for 41 blocks, 40 free"):
        UnhashedBlockPool(41).get_new_blocks(41)
    for blocks in held:
        fast.free_blocks(blocks[::-1])
    assert fast.num_free_blocks == 40
    for free in (fast.free_blocks, fast.free_table):  # every block is free: one more is twice
        with pytest.raises(AssertionError, match="freed twice"):
            free([1])


def test_paged_tables_are_blockpools_without_caching():
    """PagedAllocator without prefix caching (the list-backed UnhashedBlockPool) gives the
    tables, capacities and free order of the same allocator over the general BlockPool(lru):
    random admissions, growth (decoding, later chunks) and frees."""
    import random

    from simulator.engine.kvcache.block_pool import BlockPool, UnhashedBlockPool
    rng = random.Random(11)
    fast = PagedAllocator(num_blocks=200, block_size=4)
    ref = PagedAllocator(num_blocks=200, block_size=4)
    ref.pool = BlockPool(200, "lru")
    assert isinstance(fast.pool, UnhashedBlockPool)
    tokens: dict[int, int] = {}
    for step in range(1500):
        if tokens and rng.random() < 0.35:
            rid = rng.choice(sorted(tokens))
            fast.free(req(rid))
            ref.free(req(rid))
            del tokens[rid]
        elif tokens and rng.random() < 0.5:
            rid = rng.choice(sorted(tokens))
            n = rng.randint(1, 20)
            a = fast.allocate_slots(req(rid), n, tokens[rid])
            assert a == ref.allocate_slots(req(rid), n, tokens[rid])
            if a is not None:
                tokens[rid] += n
        else:
            n = rng.randint(1, 120)
            a = fast.allocate_slots(req(step), n, 0)
            assert a == ref.allocate_slots(req(step), n, 0)
            if a is not None:
                tokens[step] = n
        assert fast.req_to_blocks == ref.req_to_blocks
        assert fast.pool.free_queue.order() == ref.pool.free_queue.order()


@pytest.mark.parametrize("caching", [False, True])
def test_paged_allocate_many_is_one_call_each(caching):
    """allocate_slots_many (its blocks popped at once, then, with prefix caching, the served
    requests' full blocks hashed in order) gives the same capacities, tables, hashed blocks and
    free order as allocate_slots called request by request, and stops at the first request the
    free blocks cannot serve, leaving it and those after it untouched. Random batches: requests
    with and without tables, holding more than they need, asking for one block or many, some
    past the free blocks."""
    import random

    rng = random.Random(5)
    many = PagedAllocator(num_blocks=120, block_size=4, enable_prefix_caching=caching)
    each = PagedAllocator(num_blocks=120, block_size=4, enable_prefix_caching=caching)
    computed: dict[int, int] = {}
    next_id = 0
    for _ in range(400):
        ids = rng.sample(sorted(computed), min(len(computed), rng.randint(0, 6)))
        fresh = set()
        for _ in range(rng.randint(0, 2)):  # new ones (no table yet: at least one token)
            ids.insert(rng.randint(0, len(ids)), next_id)
            computed[next_id] = 0
            fresh.add(next_id)
            next_id += 1
        new = [rng.choice([1, 9, 40] if i in fresh else [0, 1, 1, 1, 3, 4, 9, 40]) for i in ids]
        comp = [computed[i] for i in ids]
        caps = many.allocate_slots_many([req(i) for i in ids], new, comp)
        want = []
        for i, n, c in zip(ids, new, comp):
            cap = each.allocate_slots(req(i), n, c)
            if cap is None:
                break
            want.append(cap)
        assert caps == want
        for i, n in zip(ids[:len(caps)], new):  # some compute less than they were given
            computed[i] += n - (rng.randint(0, n) if rng.random() < 0.3 else 0)
        assert many.req_to_blocks == each.req_to_blocks
        assert many.pool.free_queue.order() == each.pool.free_queue.order()
        assert many._num_cached == each._num_cached
        for i in rng.sample(sorted(computed), min(len(computed), rng.randint(0, 2))):
            many.free(req(i))
            each.free(req(i))
            del computed[i]
        for i in [i for i in computed if i not in each.req_to_blocks]:  # served nothing yet
            del computed[i]
