"""serve_app/prefix_index.py: decode's estimate of its engine's prefix cache, on which selective P/D
decides (tests/local/test_local_disaggregated.py shows the decision on the live server)."""

from __future__ import annotations

from serve_app.prefix_index import DEFAULT_CAPACITY_BLOCKS, PrefixIndex

BLOCK = 16


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_a_served_prompt_is_matched_by_its_full_blocks():
    index = PrefixIndex(BLOCK)
    history = tokens(0, 5 * BLOCK)
    assert index.cached_tokens(history + [7, 8]) == 0
    index.add(history)
    # The next turn: the whole history, then a short new message.
    assert index.cached_tokens(history + [7, 8]) == 5 * BLOCK


def test_a_partial_block_is_not_counted():
    index = PrefixIndex(BLOCK)
    index.add(tokens(0, 3 * BLOCK + 9))
    # The first prompt's 9 trailing tokens never made a full block, so a longer prompt that shares
    # them still computes them.
    assert index.cached_tokens(tokens(0, 4 * BLOCK)) == 3 * BLOCK
    assert len(index) == 3


def test_a_prompt_all_in_cache_still_computes_its_last_block():
    index = PrefixIndex(BLOCK)
    prompt = tokens(0, 4 * BLOCK)
    index.add(prompt)
    # vLLM computes at least the last token, and whole blocks only: the last block is computed again.
    assert index.cached_tokens(prompt) == 3 * BLOCK
    assert index.cached_tokens(prompt + [1]) == 4 * BLOCK


def test_a_different_prefix_matches_nothing_after_it_differs():
    index = PrefixIndex(BLOCK)
    index.add(tokens(0, 4 * BLOCK))
    other_head = [999] + tokens(1, 4 * BLOCK)
    assert index.cached_tokens(other_head + [1]) == 0
    # The same second block behind another first block is another block (hashes are chained).
    differs_in_block_2 = tokens(0, 2 * BLOCK) + [999] + tokens(2 * BLOCK + 1, 2 * BLOCK)
    assert index.cached_tokens(differs_in_block_2) == 2 * BLOCK


def test_another_salt_is_another_cache():
    index = PrefixIndex(BLOCK)
    prompt = tokens(0, 2 * BLOCK)
    index.add(prompt, salt=("model", "tenant-a"))
    assert index.cached_tokens(prompt + [1], salt=("model", "tenant-a")) == 2 * BLOCK
    assert index.cached_tokens(prompt + [1], salt=("model", "tenant-b")) == 0
    assert index.cached_tokens(prompt + [1]) == 0


def test_it_keeps_at_most_its_capacity_dropping_the_least_recently_served():
    index = PrefixIndex(BLOCK, capacity_blocks=4)
    first, second = tokens(0, 2 * BLOCK), tokens(1000, 2 * BLOCK)
    index.add(first)
    index.add(second)
    index.add(first)  # served again: now the most recent
    index.add(third := tokens(2000, 2 * BLOCK))
    assert len(index) == 4
    assert index.cached_tokens(second + [1]) == 0
    assert index.cached_tokens(first + [1]) == 2 * BLOCK
    assert index.cached_tokens(third + [1]) == 2 * BLOCK


def test_a_prompts_tail_goes_before_its_head():
    index = PrefixIndex(BLOCK, capacity_blocks=4)
    index.add(shared := tokens(0, 3 * BLOCK))
    index.add(tokens(1000, BLOCK))
    # One block over capacity: the shared prompt's last block goes, its head still hits.
    index.add(tokens(2000, BLOCK))
    assert index.cached_tokens(shared + [1]) == 2 * BLOCK


def test_without_a_known_capacity_it_is_bounded_still():
    index = PrefixIndex(1, capacity_blocks=None)
    for token in range(DEFAULT_CAPACITY_BLOCKS + 1):
        index.add([token])
    assert len(index) == DEFAULT_CAPACITY_BLOCKS
    assert index.cached_tokens([0, 1]) == 0
    assert index.cached_tokens([DEFAULT_CAPACITY_BLOCKS, 1]) == 1


def test_blocks_held_by_running_requests_shorten_what_it_claims():
    # The engine keeps cached prefixes only in blocks no running request holds: with 3 of its 6
    # blocks held by streams, the least recent of the 4 cached blocks cannot still be there.
    index = PrefixIndex(BLOCK, capacity_blocks=6)
    index.add(old := tokens(0, 2 * BLOCK))
    index.add(recent := tokens(1000, 2 * BLOCK))
    assert index.cached_tokens(old + [1]) == 2 * BLOCK
    assert index.cached_tokens(recent + [1], reserved_blocks=3) == 2 * BLOCK
    assert len(index) == 3
    assert index.cached_tokens(old + [1]) == BLOCK
    # A request that finishes is recorded while the others still hold theirs.
    index.add(tokens(2000, BLOCK), reserved_blocks=5)
    assert len(index) == 1
