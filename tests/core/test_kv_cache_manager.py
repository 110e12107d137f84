"""KVCacheManager: exact block ids for allocation, prefix hits, freeing and refusals."""

import pytest

from vjx.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vjx.core.kv_cache_utils import hash_request_tokens, make_block_hash_with_group_id, sha256
from vjx.core.request import Request
from vjx.sampling_params import SamplingParams


def make_request(request_id: str, prompt_token_ids: list[int]) -> Request:
    return Request(request_id, prompt_token_ids, SamplingParams(), None, arrival_time=0.0)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def allocate_prompt(manager: KVCacheManager, request: Request) -> tuple[list[int], ...]:
    """Schedule the whole prompt as the scheduler would: prefix hits, then the rest."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    num_new_tokens = request.num_tokens - num_hit_tokens
    new_blocks = manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits)
    request.num_computed_tokens = request.num_tokens
    return new_blocks.get_block_ids()


PROMPT = list(range(1, 11))  # 10 tokens: two full blocks of 4 and a partial one


def test_allocate_prompt_caches_its_full_blocks():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    a = make_request("a", PROMPT)
    hits, num_hit_tokens = manager.get_computed_blocks(a)
    assert (hits, num_hit_tokens) == (KVCacheBlocks(([],)), 0)
    assert manager.allocate_slots(a, 10, 0, hits).get_block_ids() == ([1, 2, 3],)
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    assert a.block_hashes == hash_request_tokens(sha256, 4, PROMPT)
    blocks = manager.block_pool.blocks
    keys = [make_block_hash_with_group_id(block_hash, 0) for block_hash in a.block_hashes]
    assert [blocks[i].block_hash for i in (1, 2, 3)] == [keys[0], keys[1], None]
    assert manager.num_cached_block == {"a": 2}
    assert free_ids(manager) == [4, 5, 6, 7, 8, 9, 10]
    assert manager.usage == pytest.approx(0.3)


def test_prefix_hits_across_requests_stop_one_token_short():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    assert allocate_prompt(manager, make_request("a", PROMPT)) == ([1, 2, 3],)
    b = make_request("b", PROMPT[:8] + [50, 51])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2],), 8)
    # A prompt of exactly two blocks may hit only one: its last token must be computed.
    c = make_request("c", PROMPT[:8])
    assert manager.get_computed_blocks(c)[0].get_block_ids() == ([1],)
    assert manager.get_computed_blocks(make_request("d", [1, 2, 3, 99, 5, 6]))[1] == 0
    assert manager.allocate_slots(b, 2, 8, hits).get_block_ids() == ([4],)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=2) == (2,)
    manager.free(make_request("a", PROMPT))
    assert free_ids(manager) == [5, 6, 7, 8, 9, 10, 3]
    assert manager.get_num_common_prefix_blocks("b", num_running_requests=1) == (3,)
    stats = manager.prefix_cache_stats
    assert (stats.num_requests, stats.num_queried_tokens, stats.num_hit_tokens) == (4, 34, 12)


def test_hit_on_free_cached_blocks_takes_them_out_of_the_queue():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    a = make_request("a", PROMPT)
    allocate_prompt(manager, a)
    manager.free(a)
    assert free_ids(manager) == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]
    assert manager.get_block_ids("a") == ([],)
    b = make_request("b", PROMPT[:8] + [50, 51])
    assert allocate_prompt(manager, b) == ([4],)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert free_ids(manager) == [5, 6, 7, 8, 9, 10, 3]
    assert manager.num_cached_block == {"b": 2}


def test_allocate_slots_refuses_without_partial_allocation():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=5, max_model_len=16)
    a = make_request("a", PROMPT)
    allocate_prompt(manager, a)
    assert free_ids(manager) == [4]
    assert manager.allocate_slots(make_request("b", [60, 61, 62, 63, 64, 65]), 6) is None
    assert free_ids(manager) == [4]
    assert "b" not in manager.req_to_blocks
    manager.free(a)
    assert allocate_prompt(manager, make_request("e", [70, 71, 72, 73, 74, 75])) == ([4, 3],)
    # c hits blocks 1 and 2, which sit in the free queue: they cost free blocks like new ones.
    c = make_request("c", PROMPT[:8] + [50, 51])
    hits, num_hit_tokens = manager.get_computed_blocks(c)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2],), 8)
    assert manager.allocate_slots(c, 2, 8, hits) is None
    assert free_ids(manager) == [2, 1]
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 2)] == [0, 0]
    assert manager.get_computed_blocks(c)[0].get_block_ids() == ([1, 2],)


def test_allocate_slots_rejects_bad_calls():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    a = make_request("a", PROMPT)
    allocate_prompt(manager, a)
    with pytest.raises(ValueError, match="num_new_tokens must be at least 1, got 0"):
        manager.allocate_slots(a, 0)
    hits, _ = manager.get_computed_blocks(make_request("b", PROMPT))
    with pytest.raises(ValueError, match="new_computed_blocks must be empty for request 'a'"):
        manager.allocate_slots(a, 1, 8, hits)
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        KVCacheManager(block_size=0, num_gpu_blocks=11, max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len must be at least 1, got 0"):
        KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=0)


def test_decode_adds_a_block_only_at_a_boundary_and_caches_output_blocks():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    assert allocate_prompt(manager, a) == ([1, 2],)
    assert manager.num_cached_block == {"a": 1}
    for token_id, expected_new_ids, expected_num_cached in ((7, [], 1), (8, [], 2), (9, [3], 2)):
        a.append_output_token_ids(token_id)
        assert manager.allocate_slots(a, 1).get_block_ids() == (expected_new_ids,)
        a.num_computed_tokens += 1
        assert manager.num_cached_block == {"a": expected_num_cached}
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    assert a.block_hashes == hash_request_tokens(sha256, 4, [1, 2, 3, 4, 5, 6, 7, 8])
    blocks = manager.block_pool.blocks
    assert manager.block_pool.get_cached_block(a.block_hashes[1], [0]) == [blocks[2]]


def test_preempted_request_may_hit_its_own_output_blocks():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    a.append_output_token_ids([7, 8, 9, 10])
    assert allocate_prompt(manager, a) == ([1, 2, 3],)
    manager.free(a)
    a.num_computed_tokens = 0
    hits, num_hit_tokens = manager.get_computed_blocks(a)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2],), 8)


def test_no_prefix_caching():
    manager = KVCacheManager(4, num_gpu_blocks=11, max_model_len=32, enable_caching=False)
    a = make_request("a", PROMPT)
    assert allocate_prompt(manager, a) == ([1, 2, 3],)
    assert a.block_hashes == []
    assert manager.block_pool.cached_block_hash_to_block == {}
    manager.free(a)
    b = make_request("b", PROMPT)
    assert manager.get_computed_blocks(b) == (KVCacheBlocks(([],)), 0)
    assert allocate_prompt(manager, b) == ([4, 5, 6],)
    assert manager.prefix_cache_stats.num_requests == 0


def test_reset_prefix_cache():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32)
    a = make_request("a", PROMPT)
    allocate_prompt(manager, a)
    assert manager.reset_prefix_cache() is False
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks(make_request("b", PROMPT)) == (KVCacheBlocks(([],)), 0)
