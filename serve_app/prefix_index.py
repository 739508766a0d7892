"""An estimate, kept in decode's replica, of which prompt prefixes decode's engine holds in its KV cache.

Selective P/D decides on a prompt's uncached remainder (serve_app/selective.py), but vLLM's engine
runs in another process and does not tell the replica which blocks it holds or evicts. So the
replica remembers what it sent the engine: the chained hashes of each prompt's full KV blocks, as
vLLM's prefix cache keys them (``hash_block_tokens`` in vllm/v1/core/kv_cache_utils.py: a block's
hash covers its tokens and its parent's hash, so a hit on block n means blocks 0..n hit too; only
full blocks are cached). llm-d's ``prefix-based-pd-decider`` decides on the same estimate (an
approximate prefix index of the decode endpoint, matched full blocks times the block size).

It is an estimate, fed with what the engine finished (serve_app/selective.py's ``ServedPrompts``:
each prompt with its reply, as the engine's token ids, which vLLM caches alike) and bounded by the
engine's free blocks (its blocks less those its running requests hold, which no cached prefix can
keep). The engine still evicts unseen when the estimate of what is held is off. A wrong estimate
costs time, never a wrong answer: a prompt taken for cached when it was evicted is computed whole on
decode (a longer local prefill than the threshold meant to allow); one taken for uncached goes
through prefill and NIXL, which pulls only what decode lacks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

# Blocks remembered when the engine's KV capacity is not known (a few MB of hashes).
DEFAULT_CAPACITY_BLOCKS = 65_536


class PrefixIndex:
    """Chained hashes of full blocks of ``block_size`` tokens, at most ``capacity_blocks`` of them,
    the least recently served dropped first, as vLLM evicts the least recently freed block first
    (``FreeKVCacheBlockQueue`` in vllm/v1/core/kv_cache_utils.py)."""

    def __init__(self, block_size: int, capacity_blocks: int | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks or DEFAULT_CAPACITY_BLOCKS
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def _hashes(self, tokens: Sequence[int], salt: Hashable, blocks: int) -> list[int]:
        # The salt keys the first block, as vLLM's cache_salt and LoRA do (its extra keys): requests
        # under another salt never share the engine's blocks.
        hashes, parent = [], hash(("root", salt))
        for start in range(0, blocks * self.block_size, self.block_size):
            parent = hash((parent, tuple(tokens[start : start + self.block_size])))
            hashes.append(parent)
        return hashes

    def _evict(self, reserved_blocks: int) -> None:
        while self._blocks and len(self._blocks) > self.capacity_blocks - reserved_blocks:
            self._blocks.popitem(last=False)

    def cached_tokens(self, tokens: Sequence[int], salt: Hashable = None, *, reserved_blocks: int = 0) -> int:
        """How many of ``tokens``' leading tokens the engine would serve from its cache, while
        ``reserved_blocks`` of its blocks are held by running requests."""
        self._evict(reserved_blocks)
        # vLLM computes at least a prompt's last token (for its logits), so a prompt of whole blocks
        # hits one block fewer (get_computed_blocks in vllm/v1/core/kv_cache_manager.py:
        # max_cache_hit_length = num_tokens - 1).
        matched = 0
        for block_hash in self._hashes(tokens, salt, max(len(tokens) - 1, 0) // self.block_size):
            if block_hash not in self._blocks:
                break
            matched += 1
        return matched * self.block_size

    def add(self, tokens: Sequence[int], salt: Hashable = None, *, reserved_blocks: int = 0) -> None:
        """Records that the engine now holds ``tokens``' full blocks, ``reserved_blocks`` of its blocks
        being held by running requests."""
        # A prompt's tail blocks are dropped before its head, as vLLM frees a request's blocks in
        # reverse order "so that the tail blocks are evicted first" (free in
        # vllm/v1/core/single_type_kv_cache_manager.py): a shared head outlives the tails after it.
        for block_hash in reversed(self._hashes(tokens, salt, len(tokens) // self.block_size)):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        self._evict(reserved_blocks)
