"""BlockPool, the free block queue and block hashing: exact ids, exact orders."""

import pytest

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
    hash_request_tokens,
)


def free_ids(pool: BlockPool) -> list[int]:
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def test_hash_block_tokens_is_a_stable_sha256_chain():
    first = hash_block_tokens(None, [1, 2, 3, 4])
    second = hash_block_tokens(first, [5, 6, 7, 8])
    assert first.hex() == "726555a49b091ff8e0fb8498ddb678412ec048476e24b83fa5fbb5aa19e429af"
    assert second.hex() == "ead87f6e0439d206b23fa66f47365fafef2749d483d08d73aa5aa5cd803a1997"
    # The same tokens under another parent, or with extra keys, are another block.
    assert hash_block_tokens(None, [5, 6, 7, 8]) != second
    assert hash_block_tokens(None, [1, 2, 3, 4], extra_keys=("salt",)) != first


def test_hash_request_tokens_hashes_full_blocks_only_and_extends():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    hashes = hash_request_tokens(4, tokens)
    assert hashes == [
        hash_block_tokens(None, [1, 2, 3, 4]),
        hash_block_tokens(hash_block_tokens(None, [1, 2, 3, 4]), [5, 6, 7, 8]),
    ]
    assert hash_request_tokens(4, tokens, hashes) == []
    grown = tokens + [11, 12]
    assert hash_request_tokens(4, grown, hashes) == [hash_block_tokens(hashes[1], [9, 10, 11, 12])]
    assert hash_request_tokens(4, grown) == hashes + hash_request_tokens(4, grown, hashes)
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        hash_request_tokens(0, tokens)


def test_free_queue_popleft_remove_append_keep_exact_order():
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert queue.popleft() is blocks[0]
    queue.remove(blocks[2])
    queue.append(blocks[0])
    assert ids(queue.get_all_free_blocks()) == [1, 3, 4, 0]
    assert ids(queue.popleft_n(2)) == [1, 3]
    queue.append(blocks[2])
    queue.append(blocks[1])
    assert ids(queue.get_all_free_blocks()) == [4, 0, 2, 1]
    assert queue.num_free_blocks == 4
    assert blocks[3].prev_free_block is None and blocks[3].next_free_block is None


def test_free_queue_errors():
    blocks = [KVCacheBlock(block_id=i) for i in range(2)]
    queue = FreeKVCacheBlockQueue(blocks)
    with pytest.raises(ValueError, match="n=3 exceeds the 2 free blocks"):
        queue.popleft_n(3)
    queue.popleft_n(2)
    with pytest.raises(ValueError, match="the free block queue is empty"):
        queue.popleft()
    with pytest.raises(ValueError, match="block 0 is not in the free queue"):
        queue.remove(blocks[0])
    assert repr(blocks[0]) == (
        "KVCacheBlock(block_id=0, ref_cnt=0, block_hash=None, prev=None, next=None)"
    )


def test_new_pool_reserves_block_zero():
    pool = BlockPool(num_gpu_blocks=6, enable_caching=True)
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert free_ids(pool) == [1, 2, 3, 4, 5]
    assert pool.get_num_free_blocks() == 5
    assert pool.get_usage() == 0.0
    assert ids(pool.get_new_blocks(5)) == [1, 2, 3, 4, 5]
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError, match="num_gpu_blocks must be at least 2 .* got 1"):
        BlockPool(num_gpu_blocks=1, enable_caching=True)


def test_get_new_blocks_and_free_blocks_order():
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True)
    first = pool.get_new_blocks(3)
    assert ids(first) == [1, 2, 3]
    assert [block.ref_cnt for block in first] == [1, 1, 1]
    second = pool.get_new_blocks(2)
    assert ids(second) == [4, 5]
    assert free_ids(pool) == [6, 7]
    assert pool.get_usage() == pytest.approx(5 / 7)
    # A request's blocks are freed last first, so its tail is evicted first.
    pool.free_blocks(reversed(first))
    assert free_ids(pool) == [6, 7, 3, 2, 1]
    assert ids(pool.get_new_blocks(3)) == [6, 7, 3]
    with pytest.raises(ValueError, match="num_blocks=3 exceeds the 2 free blocks"):
        pool.get_new_blocks(3)
    assert free_ids(pool) == [2, 1]
    with pytest.raises(ValueError, match="block 2 is not in use"):
        pool.free_blocks([pool.blocks[2]])


def test_shared_block_is_freed_only_by_its_last_user():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.touch([blocks[0]])
    assert [block.ref_cnt for block in blocks] == [2, 1]
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [3, 2]
    pool.free_blocks([blocks[0]])
    assert free_ids(pool) == [3, 2, 1]


def test_cached_blocks_stay_findable_until_popped_for_reuse():
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    hashes = hash_request_tokens(2, [1, 2, 3, 4, 5, 6])
    pool.cache_full_blocks(blocks, hashes, num_cached_blocks=0, num_full_blocks=2)
    assert [block.block_hash for block in blocks] == [hashes[0], hashes[1], None]
    pool.cache_full_blocks(blocks, hashes, num_cached_blocks=2, num_full_blocks=3)
    assert pool.get_cached_block(hashes[2]) is blocks[2]
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [4, 3, 2, 1]
    assert pool.get_cached_block(hashes[0]) is blocks[0]
    # LRU: the never-used block 4 goes first, then block 3 (the tail of the freed request).
    assert ids(pool.get_new_blocks(2)) == [4, 3]
    assert pool.get_cached_block(hashes[2]) is None
    assert blocks[2].block_hash is None
    assert pool.get_cached_block(hashes[1]) is blocks[1]
    # A hit on a free cached block takes it out of the middle of the queue.
    pool.touch([blocks[0]])
    assert free_ids(pool) == [2]
    assert blocks[0].ref_cnt == 1
    with pytest.raises(ValueError, match="block 1 is already cached"):
        pool.cache_full_blocks(blocks, hashes, num_cached_blocks=0, num_full_blocks=1)
    with pytest.raises(ValueError, match="num_full_blocks=4 exceeds the 3 block hashes"):
        pool.cache_full_blocks(blocks, hashes, num_cached_blocks=3, num_full_blocks=4)


def test_one_hash_may_name_two_blocks():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    block_hash = hash_block_tokens(None, [7, 7])
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(first, [block_hash], 0, 1)
    pool.cache_full_blocks(second, [block_hash], 0, 1)
    assert pool.get_cached_block(block_hash) is first[0]
    pool.free_blocks(first + second)
    assert ids(pool.get_new_blocks(2)) == [3, 1]
    assert pool.get_cached_block(block_hash) is second[0]
    assert ids(pool.get_new_blocks(1)) == [2]
    assert pool.get_cached_block(block_hash) is None
    assert pool.cached_block_hash_to_block == {}


def test_reset_prefix_cache_only_when_no_block_is_used():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(1)
    block_hash = hash_block_tokens(None, [1])
    pool.cache_full_blocks(blocks, [block_hash], 0, 1)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(block_hash) is blocks[0]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(block_hash) is None
    assert blocks[0].block_hash is None
    assert pool.prefix_cache_stats.num_resets == 1
    assert free_ids(pool) == [2, 3, 1]


def test_prefix_cache_counters():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    assert pool.prefix_cache_stats.hit_rate == 0.0
    pool.record_prefix_cache_lookup(num_queried_tokens=10, num_hit_tokens=8)
    pool.record_prefix_cache_lookup(num_queried_tokens=6, num_hit_tokens=0)
    stats = pool.prefix_cache_stats
    assert (stats.num_requests, stats.num_queried_tokens, stats.num_hit_tokens) == (2, 16, 8)
    assert stats.hit_rate == 0.5
