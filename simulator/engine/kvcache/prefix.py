"""Block hashes: the content identity of each full KV block of a request.

Requests carry no text. A request's `prefix` is None (all its content is unique) or an array
of content-chunk ids, each covering `chunk_tokens` tokens from the start of the prompt
(Mooncake's hash_ids: 512-token chunks). Token t is *shared content* (chunk_id =
prefix[t // chunk_tokens], offset t % chunk_tokens) when t // chunk_tokens < len(prefix) and t
lies in the prompt, or in the output when the ids run past the prompt's last chunk (a session
whose next turn resends this turn's answer); every other token is unique to the request.

Engine block j (tokens [j*B, (j+1)*B)) hashes, as vLLM's chain does, its parent's hash with
its content: the chunk ids it spans and its offset in the first one when all of its tokens are
shared, else (request id, j). So two requests share block j exactly when their first (j+1)*B
tokens are shared content with equal chunk ids, whatever B is relative to chunk_tokens
(B need not divide it). Hashes are Python ints from `hash()` of int tuples, which is
deterministic (PYTHONHASHSEED only salts str/bytes).
"""

from __future__ import annotations

from simulator.workload.request import Request

NONE_HASH = 0x5EED  # the chain's root, like vLLM's NONE_HASH


class BlockHasher:
    def __init__(self, block_size: int, chunk_tokens: int = 512) -> None:
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
        self.block_size = block_size
        self.chunk_tokens = chunk_tokens

    def hashes(self, req: Request, num_blocks: int) -> list[int]:
        """The first num_blocks block hashes of req (computed once, kept on the request)."""
        have = req.block_hashes
        if have is None:
            have = req.block_hashes = []
        if len(have) >= num_blocks:
            return have
        bs, c = self.block_size, self.chunk_tokens
        prefix = req.prefix
        shared_tokens = 0
        if prefix is not None:
            covered = len(prefix) * c
            # ids beyond the prompt's chunks describe the output too (a session's next turn
            # resends this turn's answer); otherwise the output is unique to the request
            limit = req.prompt_tokens if covered <= -(-req.prompt_tokens // c) * c else \
                req.prompt_tokens + req.output_tokens
            shared_tokens = min(covered, limit)
        parent = have[-1] if have else NONE_HASH
        for j in range(len(have), num_blocks):
            start, end = j * bs, (j + 1) * bs
            if end <= shared_tokens:
                first, last = start // c, (end - 1) // c
                if first == last:
                    parent = hash((parent, int(prefix[first]), start - first * c))
                else:
                    ids = tuple(int(x) for x in prefix[first:last + 1])
                    parent = hash((parent, ids, start - first * c))
            else:
                parent = hash((parent, -1, req.req_id, j))
            have.append(parent)
        return have
