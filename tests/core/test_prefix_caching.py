"""Prefix caching through KVCacheManager, one full-attention group: after every operation,
the exact block ids, ref counts, hashes and free-queue order."""

import pytest

from vjx.core.kv_cache_coordinator import NoPrefixCacheCoordinator, UnitaryKVCacheCoordinator
from vjx.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vjx.core.kv_cache_utils import hash_block_tokens, make_block_hash_with_group_id, sha256
from vjx.core.request import Request
from vjx.sampling_params import SamplingParams


def make_request(request_id: str, prompt_token_ids: list[int], cache_salt: str | None = None):
    params = SamplingParams()
    return Request(request_id, prompt_token_ids, params, None, 0.0, cache_salt=cache_salt)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def ref_cnts(manager: KVCacheManager, block_ids: list[int]) -> list[int]:
    return [manager.block_pool.blocks[i].ref_cnt for i in block_ids]


def schedule_prompt(manager: KVCacheManager, request: Request) -> tuple[list[int], ...] | None:
    """As the scheduler admits a request: look up its prefix, then allocate the rest."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    num_new_tokens = request.num_tokens - num_hit_tokens
    new_blocks = manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits)
    if new_blocks is None:
        return None
    request.num_computed_tokens = request.num_tokens
    return new_blocks.get_block_ids()


def decode(manager: KVCacheManager, request: Request, token_id: int) -> tuple[list[int], ...]:
    request.append_output_token_ids(token_id)
    new_blocks = manager.allocate_slots(request, 1)
    request.num_computed_tokens += 1
    return new_blocks.get_block_ids()


COMMON = [i for i in range(3) for _ in range(16)]  # three full blocks of 16


def test_prefill_hits_a_repeated_prefix_and_evicts_in_lru_order():
    manager = KVCacheManager(block_size=16, num_gpu_blocks=11, max_model_len=8192)
    assert isinstance(manager.coordinator, UnitaryKVCacheCoordinator)
    r0 = make_request("r0", COMMON + [3] * 7)
    hits, num_hit_tokens = manager.get_computed_blocks(r0)
    assert (hits.get_block_ids(), num_hit_tokens, len(r0.block_hashes)) == (([],), 0, 3)
    assert manager.allocate_slots(r0, 55, 0, hits).get_block_ids() == ([1, 2, 3, 4],)
    parent = None
    for block_id in (1, 2, 3):
        parent = hash_block_tokens(sha256, parent, COMMON[(block_id - 1) * 16 : block_id * 16])
        block = manager.block_pool.blocks[block_id]
        assert (block.block_hash, block.ref_cnt) == (make_block_hash_with_group_id(parent, 0), 1)
    partial_block = manager.block_pool.blocks[4]
    assert (partial_block.block_hash, partial_block.ref_cnt) == (None, 1)
    r0.num_computed_tokens = 55

    # A hit on blocks another running request holds.
    r1 = make_request("r1", COMMON + [3] * 5)
    hits, num_hit_tokens = manager.get_computed_blocks(r1)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2, 3],), 48)
    assert manager.allocate_slots(r1, 5, 48, hits).get_block_ids() == ([5],)
    assert ref_cnts(manager, [1, 2, 3, 4, 5]) == [2, 2, 2, 1, 1]
    assert free_ids(manager) == [6, 7, 8, 9, 10]

    manager.free(r0)
    manager.free(r1)
    # Never used first, then r0's tail, r1's tail, and the shared prefix last first.
    assert free_ids(manager) == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]

    # A hit on free cached blocks pulls them out of the queue.
    r2 = make_request("r2", COMMON + [3] * 6)
    assert schedule_prompt(manager, r2) == ([6],)
    assert manager.get_block_ids("r2") == ([1, 2, 3, 6],)
    assert free_ids(manager) == [7, 8, 9, 10, 4, 5]
    manager.free(r2)
    assert free_ids(manager) == [7, 8, 9, 10, 4, 5, 6, 3, 2, 1]

    # A miss of ten blocks takes the whole queue from the head, evicting as it goes.
    r3 = make_request("r3", [99] * 160)
    assert schedule_prompt(manager, r3) == ([7, 8, 9, 10, 4, 5, 6, 3, 2, 1],)
    assert free_ids(manager) == []
    assert manager.get_computed_blocks(make_request("r4", COMMON + [3]))[1] == 0
    stats = manager.prefix_cache_stats
    assert (stats.num_requests, stats.num_queried_tokens, stats.num_hit_tokens) == (5, 371, 96)


def test_partial_block_prompts_hit_full_blocks_only():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=64)
    a = make_request("a", list(range(10)))
    assert schedule_prompt(manager, a) == ([1, 2, 3],)
    # The partial block 3 holds tokens 8, 9 but has no hash: it is never a hit.
    assert (len(a.block_hashes), manager.block_pool.blocks[3].block_hash) == (2, None)
    assert manager.get_computed_blocks(make_request("b", list(range(10))))[0].get_block_ids() == ([1, 2],)
    # Prompts of exactly one or two blocks leave their last token to compute.
    assert manager.get_computed_blocks(make_request("c", list(range(8))))[1] == 4
    assert manager.get_computed_blocks(make_request("d", list(range(4))))[1] == 0
    assert manager.get_computed_blocks(make_request("e", list(range(3))))[1] == 0
    assert manager.get_computed_blocks(make_request("f", list(range(9))))[1] == 8


def test_decode_caches_each_block_when_its_last_token_is_known():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=64)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    assert schedule_prompt(manager, a) == ([1, 2],)
    assert decode(manager, a, 7) == ([],)
    # Token 8 fills block 2: the block enters the cache when the step computing 8 is allocated.
    a.append_output_token_ids(8)
    assert manager.num_cached_block == {"a": 1}
    assert manager.allocate_slots(a, 1).get_block_ids() == ([],)
    a.num_computed_tokens += 1
    assert manager.num_cached_block == {"a": 2}
    assert decode(manager, a, 9) == ([3],)
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert schedule_prompt(manager, b) == ([4],)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert ref_cnts(manager, [1, 2, 3, 4]) == [2, 2, 1, 1]


def test_eviction_under_pressure_takes_the_least_recently_freed_blocks():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=7, max_model_len=64)
    a, b = make_request("a", [1] * 8 + [0]), make_request("b", [2] * 8 + [0])
    assert schedule_prompt(manager, a) == ([1, 2, 3],)
    assert schedule_prompt(manager, b) == ([4, 5, 6],)
    manager.free(a)
    manager.free(b)
    assert free_ids(manager) == [3, 2, 1, 6, 5, 4]
    # c needs two blocks: a's partial block 3 and a's second block 2 go first.
    c = make_request("c", [3] * 5)
    assert schedule_prompt(manager, c) == ([3, 2],)
    assert manager.get_computed_blocks(make_request("a2", [1] * 8 + [0]))[1] == 4
    assert manager.get_computed_blocks(make_request("b2", [2] * 8 + [0]))[1] == 8
    # Reusing b's prefix moves its blocks to c's side of the LRU order once freed.
    b2 = make_request("b2", [2] * 8 + [7])
    assert schedule_prompt(manager, b2) == ([1],)
    assert manager.get_block_ids("b2") == ([4, 5, 1],)
    assert free_ids(manager) == [6]
    manager.free(b2)
    manager.free(c)
    assert free_ids(manager) == [6, 1, 5, 4, 2, 3]


def test_hits_are_touched_before_new_blocks_are_popped():
    """A hit block sitting at the head of the free queue must not be evicted for its own
    request's new blocks."""
    manager = KVCacheManager(block_size=4, num_gpu_blocks=5, max_model_len=64)
    a = make_request("a", [1, 2, 3, 4, 5])
    assert schedule_prompt(manager, a) == ([1, 2],)
    manager.free(a)
    x = make_request("x", [9] * 8)
    assert schedule_prompt(manager, x) == ([3, 4],)
    manager.free(x)
    assert schedule_prompt(manager, make_request("y", [8])) == ([2],)
    assert free_ids(manager) == [1, 4, 3]
    b = make_request("b", [1, 2, 3, 4, 6, 7, 8, 9, 10])
    assert schedule_prompt(manager, b) == ([4, 3],)
    assert manager.get_block_ids("b") == ([1, 4, 3],)
    assert ref_cnts(manager, [1, 2, 3, 4]) == [1, 1, 1, 1]


def test_refusal_with_hits_changes_nothing():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=5, max_model_len=64)
    a = make_request("a", list(range(9)))
    assert schedule_prompt(manager, a) == ([1, 2, 3],)
    manager.free(a)
    assert free_ids(manager) == [4, 3, 2, 1]
    hold = make_request("hold", [50, 51, 52, 53, 54])
    assert schedule_prompt(manager, hold) == ([4, 3],)
    # b hits the free blocks 1 and 2 and needs one more: three free blocks, two exist.
    b = make_request("b", list(range(8)) + [70, 71, 72, 73])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2],), 8)
    assert manager.allocate_slots(b, 4, 8, hits) is None
    assert (free_ids(manager), ref_cnts(manager, [1, 2])) == ([2, 1], [0, 0])
    assert "b" not in manager.req_to_blocks
    manager.free(hold)
    assert manager.allocate_slots(b, 4, 8, hits).get_block_ids() == ([3],)
    assert free_ids(manager) == [4]


def test_cache_salt_isolates_tenants():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=21, max_model_len=64)
    prompt = list(range(13))
    assert schedule_prompt(manager, make_request("a", prompt, cache_salt="tenant-a")) == ([1, 2, 3, 4],)
    assert manager.get_computed_blocks(make_request("b", prompt, cache_salt="tenant-b"))[1] == 0
    assert manager.get_computed_blocks(make_request("c", prompt))[1] == 0
    a2 = make_request("a2", prompt, cache_salt="tenant-a")
    assert manager.get_computed_blocks(a2)[0].get_block_ids() == ([1, 2, 3],)
    # Unsalted requests share among themselves, apart from every tenant.
    assert schedule_prompt(manager, make_request("d", prompt)) == ([5, 6, 7, 8],)
    assert manager.get_computed_blocks(make_request("e", prompt))[0].get_block_ids() == ([5, 6, 7],)
    # The salt enters the first block only, yet through the chain it changes every hash.
    unsalted = make_request("f", prompt)
    manager.get_computed_blocks(unsalted)
    assert all(x != y for x, y in zip(a2.block_hashes, unsalted.block_hashes, strict=True))


def test_common_prefix_blocks_of_running_requests():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=21, max_model_len=64)
    shared = list(range(8))
    a, b = make_request("a", shared + [100, 101, 102]), make_request("b", shared + [200])
    schedule_prompt(manager, a)
    schedule_prompt(manager, b)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=2) == (2,)
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=3) == (0,)
    manager.free(b)
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=1) == (3,)


def test_prefix_caching_off_uses_the_no_prefix_cache_coordinator():
    manager = KVCacheManager(4, num_gpu_blocks=11, max_model_len=64, enable_caching=False)
    assert isinstance(manager.coordinator, NoPrefixCacheCoordinator)
    a = make_request("a", list(range(10)))
    assert schedule_prompt(manager, a) == ([1, 2, 3],)
    assert (a.block_hashes, manager.block_pool.cached_block_hash_to_block) == ([], {})
    manager.free(a)
    b = make_request("b", list(range(10)))
    assert manager.get_computed_blocks(b) == (KVCacheBlocks(([],)), 0)
    assert schedule_prompt(manager, b) == ([4, 5, 6],)
    assert manager.prefix_cache_stats.num_requests == 0


def test_blake2b_hashing_gives_the_same_hits():
    manager = KVCacheManager(4, num_gpu_blocks=11, max_model_len=64, hash_algo="blake2b")
    a = make_request("a", list(range(10)))
    assert schedule_prompt(manager, a) == ([1, 2, 3],)
    assert [len(block_hash) for block_hash in a.block_hashes] == [16, 16]
    assert manager.get_computed_blocks(make_request("b", list(range(10))))[1] == 8
    with pytest.raises(ValueError, match="hash_algo must be one of"):
        KVCacheManager(4, num_gpu_blocks=11, max_model_len=64, hash_algo="md5")


def test_reset_prefix_cache_forgets_every_prefix():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=64)
    a = make_request("a", list(range(10)))
    schedule_prompt(manager, a)
    assert manager.reset_prefix_cache() is False
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert manager.block_pool.cached_block_hash_to_block == {}
    assert manager.get_computed_blocks(make_request("b", list(range(10)))) == (
        KVCacheBlocks(([],)),
        0,
    )
    assert manager.usage == 0.0
