"""Sliding-window groups and the Hybrid coordinator: exact hits, freed blocks and block ids."""

import pytest

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    NoPrefixCacheCoordinator,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from vjx.core.kv_cache_manager import KVCacheManager
from vjx.core.kv_cache_utils import hash_request_tokens, sha256
from vjx.core.request import Request
from vjx.core.single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec
from vjx.sampling_params import SamplingParams

HEADS = dict(num_kv_heads=2, head_size=8, dtype="float32")
FULL = KVCacheGroupSpec(("layers.0",), FullAttentionSpec(block_size=4, **HEADS))
WINDOW = KVCacheGroupSpec(("layers.1",), SlidingWindowSpec(block_size=4, **HEADS, sliding_window=8))
PROMPT = list(range(20))  # five full blocks of 4


def make_request(request_id: str, prompt_token_ids: list[int]) -> Request:
    return Request(request_id, prompt_token_ids, SamplingParams(), None, 0.0)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def schedule_prompt(manager: KVCacheManager, request: Request) -> tuple[list[int], ...]:
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    num_new_tokens = request.num_tokens - num_hit_tokens
    new_blocks = manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits)
    request.num_computed_tokens = request.num_tokens
    return new_blocks.get_block_ids()


def decode(manager: KVCacheManager, request: Request, token_id: int) -> tuple[list[int], ...]:
    request.append_output_token_ids(token_id)
    new_blocks = manager.allocate_slots(request, 1)
    request.num_computed_tokens += 1
    return new_blocks.get_block_ids()


def hit(manager: KVCacheManager, prompt: list[int]) -> tuple[tuple[list[int], ...], int]:
    hits, num_hit_tokens = manager.get_computed_blocks(make_request("probe", prompt))
    return hits.get_block_ids(), num_hit_tokens


def test_sliding_window_hit_needs_a_full_window_or_a_run_from_the_start():
    pool = BlockPool(num_gpu_blocks=10, enable_caching=True)
    manager = SlidingWindowManager(WINDOW.kv_cache_spec, pool, kv_cache_group_id=0)
    block_hashes = hash_request_tokens(sha256, 4, list(range(28)))
    blocks = pool.get_new_blocks(7)
    for i in (0, 1, 3, 4, 6):  # blocks 3 and 6 (indices 2 and 5) are not cached
        pool.cache_full_blocks(blocks, block_hashes, i, i + 1, kv_cache_group_id=0)

    def hit_ids(max_length: int) -> list[int]:
        (computed,) = manager.find_longest_cache_hit(block_hashes, max_length, [0])
        return [block.block_id for block in computed]

    # A token reads 7 earlier ones: two contiguous cached blocks end a usable prefix.
    assert manager.sliding_window_contiguous_blocks == 2
    assert hit_ids(28) == [0, 0, 0, 4, 5]
    assert hit_ids(27) == [0, 0, 0, 4, 5]
    assert hit_ids(16) == [1, 2]
    assert hit_ids(3) == []
    wide = SlidingWindowManager(SlidingWindowSpec(4, **HEADS, sliding_window=16), pool, kv_cache_group_id=0)
    # No four contiguous cached blocks: only the run from the first block is usable.
    (computed,) = wide.find_longest_cache_hit(block_hashes, 28, [0])
    assert [block.block_id for block in computed] == [1, 2]
    (computed,) = FullAttentionManager(FULL.kv_cache_spec, pool, 0).find_longest_cache_hit(block_hashes, 28, [0])
    assert [block.block_id for block in computed] == [1, 2]


def test_sliding_window_frees_blocks_that_left_the_window():
    manager = KVCacheManager(4, num_gpu_blocks=21, max_model_len=64, kv_cache_groups=[WINDOW])
    assert isinstance(manager.coordinator, UnitaryKVCacheCoordinator)
    a = make_request("a", PROMPT)
    assert schedule_prompt(manager, a) == ([1, 2, 3, 4, 5],)
    # Token 20 reads positions 13..20: blocks 0-2 (tokens 0..11) go back, tail block first.
    assert decode(manager, a, 100) == ([6],)
    assert manager.get_block_ids("a") == ([0, 0, 0, 4, 5, 6],)
    assert free_ids(manager) == list(range(7, 21)) + [3, 2, 1]
    assert [manager.block_pool.blocks[i].ref_cnt for i in (0, 1, 4)] == [0, 0, 1]
    assert decode(manager, a, 101) == ([],)
    assert decode(manager, a, 102) == ([],)
    assert manager.get_block_ids("a") == ([0, 0, 0, 4, 5, 6],)
    # Token 23 reads positions 16..23: block 4 (tokens 12..15) leaves the window too.
    assert decode(manager, a, 103) == ([],)
    assert manager.get_block_ids("a") == ([0, 0, 0, 0, 5, 6],)
    assert free_ids(manager)[-4:] == [3, 2, 1, 4]
    assert decode(manager, a, 104) == ([7],)
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=1) == (0,)
    manager.free(a)
    assert free_ids(manager)[-4:] == [4, 7, 6, 5]
    assert manager.block_pool.get_num_free_blocks() == 20


def test_a_sliding_window_keeps_the_blocks_of_unverified_tokens():
    # Async scheduling with 2 drafts in flight: the request's true position may be 2 earlier.
    manager = KVCacheManager(4, num_gpu_blocks=21, max_model_len=64, kv_cache_groups=[WINDOW], num_unverified_tokens=2)
    a = make_request("a", PROMPT)
    schedule_prompt(manager, a)
    # Token 20 may be token 18, which reads positions 11..18: block 2 (tokens 8..11) stays.
    assert decode(manager, a, 100) == ([6],)
    assert manager.get_block_ids("a") == ([0, 0, 3, 4, 5, 6],)


def test_sliding_window_hit_shares_the_window_blocks_only():
    manager = KVCacheManager(4, num_gpu_blocks=21, max_model_len=64, kv_cache_groups=[WINDOW])
    a = make_request("a", PROMPT)
    schedule_prompt(manager, a)
    decode(manager, a, 100)
    b = make_request("b", PROMPT + [7])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit_tokens) == (([0, 0, 0, 4, 5],), 20)
    assert manager.allocate_slots(b, 1, 20, hits).get_block_ids() == ([7],)
    assert [manager.block_pool.blocks[i].ref_cnt for i in (4, 5, 6, 7)] == [2, 2, 1, 1]
    manager.free(a)
    assert free_ids(manager) == list(range(8, 21)) + [3, 2, 1, 6]


def test_hybrid_allocates_per_group_and_frees_out_of_window_blocks():
    manager = KVCacheManager(4, num_gpu_blocks=31, max_model_len=64, kv_cache_groups=[FULL, WINDOW])
    assert isinstance(manager.coordinator, HybridKVCacheCoordinator)
    a = make_request("a", PROMPT)
    assert schedule_prompt(manager, a) == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert decode(manager, a, 100) == ([11], [12])
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 11], [0, 0, 0, 9, 10, 12])
    assert free_ids(manager) == list(range(13, 31)) + [8, 7, 6]
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=1) == (6, 0)
    # Both groups can use all five blocks: full attention all of them, the window its last two.
    b = make_request("b", PROMPT + [7])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2, 3, 4, 5], [0, 0, 0, 9, 10]), 20)
    assert manager.allocate_slots(b, 1, 20, hits).get_block_ids() == ([13], [14])
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=2) == (5, 0)
    manager.free(b)
    # b's shared blocks stay with a; its own last blocks go back, group by group.
    assert free_ids(manager) == list(range(15, 31)) + [8, 7, 6, 13, 14]
    manager.free(a)
    assert free_ids(manager) == (list(range(15, 31)) + [8, 7, 6, 13, 14] + [11, 5, 4, 3, 2, 1] + [12, 10, 9])


def test_hybrid_hit_is_the_longest_prefix_valid_for_every_group():
    manager = KVCacheManager(4, num_gpu_blocks=31, max_model_len=64, kv_cache_groups=[FULL, WINDOW])
    a = make_request("a", PROMPT)
    schedule_prompt(manager, a)
    decode(manager, a, 100)
    assert free_ids(manager) == list(range(13, 31)) + [8, 7, 6]
    # Evict the window group's blocks of tokens 4..11 (blocks 7 and 8), keep the rest.
    assert schedule_prompt(manager, make_request("d", list(range(100, 132)))) == (
        list(range(13, 21)),
        list(range(21, 29)),
    )
    assert schedule_prompt(manager, make_request("e", [200, 201, 202, 203, 204])) == (
        [29, 30],
        [8, 7],
    )
    assert free_ids(manager) == [6]
    # Full attention hits 3 blocks, but the window then has only block 6 from the start:
    # the hit shrinks to one block in both groups.
    assert hit(manager, PROMPT[:12] + [55, 56, 57]) == (([1], [6]), 4)
    # With the window's last two blocks (9 and 10, held by a) cached, all five blocks hit.
    assert hit(manager, PROMPT + [7]) == (([1, 2, 3, 4, 5], [0, 0, 0, 9, 10]), 20)
    # A full-attention miss bounds the window group.
    assert hit(manager, [999] + PROMPT[1:] + [7]) == (([], []), 0)


def test_hybrid_refusal_changes_nothing():
    manager = KVCacheManager(4, num_gpu_blocks=12, max_model_len=64, kv_cache_groups=[FULL, WINDOW])
    a = make_request("a", PROMPT)
    assert schedule_prompt(manager, a) == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    b = make_request("b", list(range(50, 55)))
    assert manager.allocate_slots(b, 5) is None  # two blocks per group, one free
    assert free_ids(manager) == [11]
    assert manager.get_block_ids("b") == ([], [])


def test_coordinator_choice_and_validation():
    assert isinstance(get_kv_cache_coordinator([FULL], 8, False), NoPrefixCacheCoordinator)
    assert isinstance(get_kv_cache_coordinator([FULL, FULL], 8, True), UnitaryKVCacheCoordinator)
    assert isinstance(get_kv_cache_coordinator([WINDOW, FULL], 8, True), HybridKVCacheCoordinator)
    no_cache = KVCacheManager(4, 8, 64, enable_caching=False, kv_cache_groups=[FULL, WINDOW])
    assert no_cache.get_computed_blocks(make_request("a", PROMPT))[1] == 0
    with pytest.raises(ValueError, match=r"must share one kv_cache_spec .* got 2 specs"):
        UnitaryKVCacheCoordinator([FULL, WINDOW], 8, True)
    other_size = KVCacheGroupSpec(("x",), FullAttentionSpec(block_size=8, **HEADS))
    with pytest.raises(ValueError, match=r"must share one block_size, got \[4, 8\]"):
        get_kv_cache_coordinator([FULL, other_size], 8, True)
    with pytest.raises(ValueError, match="must hold at least one group"):
        get_kv_cache_coordinator([], 8, True)
    with pytest.raises(ValueError, match="must use block_size=16, got a group with block_size=4"):
        KVCacheManager(16, 8, 64, kv_cache_groups=[FULL])
    with pytest.raises(ValueError, match="sliding_window must be at least 1, got 0"):
        SlidingWindowSpec(block_size=4, **HEADS, sliding_window=0)
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        FullAttentionSpec(block_size=0, **HEADS)
