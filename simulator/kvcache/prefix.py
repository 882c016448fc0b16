"""Block hashes: the content identity of each full KV block of a request.

Requests carry no text. A request's `prefix` is None (all its content is unique) or an array
of content-chunk ids, each covering `chunk_tokens` tokens of the prompt from its start
(Mooncake's hash_ids: 512-token chunks). Token t of the prompt is *shared content*
(chunk_id = prefix[t // chunk_tokens], offset t % chunk_tokens) when t // chunk_tokens <
len(prefix); every other token (the rest of the prompt, every output token) is unique to
the request.

Engine block j (tokens [j*B, (j+1)*B)) hashes, as vLLM's chain does, its parent's hash with
its content: the chunk ids it spans and its offset in the first one when all of its tokens are
shared, else (request id, j). So two requests share block j exactly when their first (j+1)*B
tokens are shared content with equal chunk ids, whatever B is relative to chunk_tokens
(B need not divide it). Hashes are Python ints from `hash()` of int tuples, which is
deterministic (PYTHONHASHSEED only salts str/bytes).
"""

from __future__ import annotations

from simulator.request import Request

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
        shared_tokens = 0 if prefix is None else min(len(prefix) * c, req.prompt_tokens)
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
