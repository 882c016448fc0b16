"""CPU swap space for swap preemption (vLLM v0's `swap_space`).

A swapped-out request keeps its computed tokens: its KV moves GPU -> CPU over the host link
and comes back before it resumes. Cost of a move of `n` transfers and `b` bytes:

    seconds = n * latency + b / host_link_bandwidth

vLLM v0 keeps a K and a V cache tensor per layer and swaps with one cudaMemcpyAsync per block
per tensor (`swap_blocks`), so a paged cache makes blocks * 2 * layers transfers: small blocks
pay the per-transfer latency many more times. A contiguous cache moves one region per tensor.
The swap time is charged to the engine step that performs it. When the CPU space cannot hold
a victim, the scheduler falls back to recompute.
"""

from __future__ import annotations

from simulator.engine.protocols import SwapStats
from simulator.errors import ConfigError
from simulator.workload.request import Request


class HostLink:
    """One direction of the GPU <-> host link (PCIe): a move of `nbytes` in `transfers` copies
    takes transfers * latency + nbytes / bandwidth. Used by swap preemption and by the CPU
    offload tier (kvcache/offload.py), which also queues its moves on it (`busy_until_s`)."""

    def __init__(self, link_gbps: float, latency_s: float) -> None:
        self.link_bps = link_gbps * 1e9
        self.latency_s = latency_s
        self.busy_until_s = 0.0  # a FIFO of transfers: the next one starts when this one ends

    def transfer_s(self, nbytes: int, transfers: int = 1) -> float:
        return transfers * self.latency_s + nbytes / self.link_bps

    def submit(self, now: float, nbytes: int, transfers: int = 1) -> float:
        """Queue a transfer submitted at `now` behind those in flight; returns its end time."""
        end = max(now, self.busy_until_s) + self.transfer_s(nbytes, transfers)
        self.busy_until_s = end
        return end


class SwapSpace:
    def __init__(self, capacity_bytes: int, block_size: int, bytes_per_token: int,
                 link_gbps: float, latency_s: float, per_block_transfers: bool = True,
                 tensors: int = 1) -> None:
        block_bytes = block_size * bytes_per_token
        if capacity_bytes < block_bytes:
            raise ConfigError(f"engine.swap_space_gib ({capacity_bytes / 2**30:.4g} GiB) is smaller "
                              f"than one KV block ({block_bytes / 2**20:.3g} MiB)")
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token
        self.capacity_blocks = capacity_bytes // block_bytes
        self.link = HostLink(link_gbps, latency_s)
        self.per_block_transfers = per_block_transfers
        self.tensors = tensors  # KV tensors copied separately (2 * layers in vLLM v0)
        self.req_to_blocks: dict[int, int] = {}
        self.used_blocks = 0
        self.bytes_moved = 0
        self.seconds = 0.0
        self.num_swap_outs = 0
        self.num_swap_ins = 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_hold(self, num_tokens: int) -> bool:
        return self.used_blocks + self.blocks_for(num_tokens) <= self.capacity_blocks

    def holds(self, req: Request) -> bool:
        return req.req_id in self.req_to_blocks

    def _move(self, blocks: int) -> float:
        nbytes = blocks * self.block_size * self.bytes_per_token
        transfers = (blocks if self.per_block_transfers else 1) * self.tensors
        t = self.link.transfer_s(nbytes, transfers)
        self.bytes_moved += nbytes
        self.seconds += t
        return t

    def swap_out(self, req: Request, num_tokens: int) -> float:
        blocks = self.blocks_for(num_tokens)
        self.req_to_blocks[req.req_id] = blocks
        self.used_blocks += blocks
        self.num_swap_outs += 1
        return self._move(blocks)

    def swap_in(self, req: Request) -> float:
        blocks = self.req_to_blocks.pop(req.req_id)
        self.used_blocks -= blocks
        self.num_swap_ins += 1
        return self._move(blocks)

    def stats(self) -> SwapStats:
        return SwapStats(self.num_swap_outs, self.num_swap_ins, self.bytes_moved, self.seconds)
