"""BlockPool, the free block queue and block hashing: exact ids, exact orders."""

import hashlib
import struct

import pytest

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_utils import (
    NONE_HASH,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    blake2b,
    get_hash_fn_by_name,
    hash_block_tokens,
    hash_request_tokens,
    make_block_hash_with_group_id,
    sha256,
)


def free_ids(pool: BlockPool) -> list[int]:
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def hashes(block_size: int, token_ids: list[int]) -> list[bytes]:
    return hash_request_tokens(sha256, block_size, token_ids)


def test_hash_block_tokens_is_a_stable_sha256_chain():
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
    second = hash_block_tokens(sha256, first, [5, 6, 7, 8])
    assert first.hex() == "95e275aa317acba0afc616ce66bd19b5e7e1365738afbc3bd7783c6c47cd3e46"
    assert second.hex() == "4042c0beb34f1b08f433aa08995ead02ffc50a5ec78cf5854a377c1d338f1bb5"
    # The encoding: (parent length, number of tokens), parent, int64 tokens, repr(extra keys).
    data = struct.pack("<BI", 32, 4) + first + struct.pack("<4q", 5, 6, 7, 8)
    assert second == hashlib.sha256(data).digest()
    salted = struct.pack("<BI", 32, 4) + NONE_HASH + struct.pack("<4q", 1, 2, 3, 4) + b"('s',)"
    assert hash_block_tokens(sha256, None, [1, 2, 3, 4], ("s",)) == hashlib.sha256(salted).digest()
    # The same tokens under another parent, or with extra keys, are another block.
    assert hash_block_tokens(sha256, None, [5, 6, 7, 8]) != second
    assert hash_block_tokens(sha256, None, [1, 2, 3, 4], extra_keys=("lora-a",)) != first


def test_blake2b_is_the_selectable_alternative():
    assert get_hash_fn_by_name("sha256") is sha256
    assert get_hash_fn_by_name("blake2b") is blake2b
    first = hash_block_tokens(blake2b, None, [1, 2, 3, 4])
    assert first.hex() == "87c09b048a8f6665c81bd47459473286"
    second = hash_block_tokens(blake2b, first, [5, 6, 7, 8])
    assert hash_request_tokens(blake2b, 4, [1, 2, 3, 4, 5, 6, 7, 8]) == [first, second]
    with pytest.raises(ValueError, match=r"hash_algo must be one of \['blake2b', 'sha256'\]"):
        get_hash_fn_by_name("xxhash")


def test_hash_request_tokens_hashes_full_blocks_only_and_extends():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    known = hashes(4, tokens)
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
    assert known == [first, hash_block_tokens(sha256, first, [5, 6, 7, 8])]
    assert hash_request_tokens(sha256, 4, tokens, known) == []
    grown = tokens + [11, 12]
    new = hash_request_tokens(sha256, 4, grown, known)
    assert new == [hash_block_tokens(sha256, known[1], [9, 10, 11, 12])]
    assert hashes(4, grown) == known + new
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        hash_request_tokens(sha256, 0, tokens)


def test_cache_salt_enters_the_first_block_only_and_changes_the_chain():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    salted = hash_request_tokens(sha256, 4, tokens, cache_salt="tenant-a")
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4], ("tenant-a",))
    assert salted == [first, hash_block_tokens(sha256, first, [5, 6, 7, 8])]
    assert salted[0] != hashes(4, tokens)[0] and salted[1] != hashes(4, tokens)[1]
    assert hash_request_tokens(sha256, 4, tokens, cache_salt="tenant-b")[0] != salted[0]
    # Extending a salted request adds no salt to later blocks.
    grown = tokens + [9, 10, 11, 12]
    assert hash_request_tokens(sha256, 4, grown, salted, cache_salt="tenant-a") == [
        hash_block_tokens(sha256, salted[1], [9, 10, 11, 12])
    ]


def test_free_queue_popleft_remove_append_keep_exact_order():
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert queue.popleft() is blocks[0]
    queue.remove(blocks[2])
    queue.append(blocks[0])
    assert ids(queue.get_all_free_blocks()) == [1, 3, 4, 0]
    assert ids(queue.popleft_n(2)) == [1, 3]
    assert blocks[1].prev_free_block is None and blocks[3].next_free_block is None
    queue.append_n([blocks[2], blocks[1]])
    assert ids(queue.get_all_free_blocks()) == [4, 0, 2, 1]
    assert queue.num_free_blocks == 4
    assert ids(queue.popleft_n(4)) == [4, 0, 2, 1]
    assert queue.get_all_free_blocks() == [] and queue.num_free_blocks == 0
    queue.append_n([])
    queue.append_n([blocks[3]])
    assert ids(queue.get_all_free_blocks()) == [3]
    assert queue.popleft_n(0) == [] and queue.num_free_blocks == 1


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
    assert repr(blocks[0]) == ("KVCacheBlock(block_id=0, ref_cnt=0, block_hash=None, prev=None, next=None)")


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


def test_null_block_is_never_counted_nor_freed():
    pool = BlockPool(num_gpu_blocks=3, enable_caching=True)
    pool.touch([pool.null_block, pool.null_block])
    pool.free_blocks([pool.null_block])
    assert pool.null_block.ref_cnt == 0
    assert free_ids(pool) == [1, 2]


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
    block_hashes = hashes(2, [1, 2, 3, 4, 5, 6])
    pool.cache_full_blocks(blocks, block_hashes, 0, 2, kv_cache_group_id=0)
    keys = [make_block_hash_with_group_id(h, 0) for h in block_hashes]
    assert [block.block_hash for block in blocks] == [keys[0], keys[1], None]
    assert keys[0] == block_hashes[0] + b"\x00\x00\x00\x00"
    pool.cache_full_blocks(blocks, block_hashes, 2, 3, kv_cache_group_id=0)
    assert pool.get_cached_block(block_hashes[2], [0]) == [blocks[2]]
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [4, 3, 2, 1]
    assert pool.get_cached_block(block_hashes[0], [0]) == [blocks[0]]
    # LRU: the never-used block 4 goes first, then block 3 (the tail of the freed request).
    assert ids(pool.get_new_blocks(2)) == [4, 3]
    assert pool.get_cached_block(block_hashes[2], [0]) is None
    assert blocks[2].block_hash is None
    assert pool.get_cached_block(block_hashes[1], [0]) == [blocks[1]]
    # A hit on a free cached block takes it out of the middle of the queue.
    pool.touch([blocks[0]])
    assert free_ids(pool) == [2]
    assert blocks[0].ref_cnt == 1
    with pytest.raises(ValueError, match="block 1 is already cached"):
        pool.cache_full_blocks(blocks, block_hashes, 0, 1, kv_cache_group_id=0)
    with pytest.raises(ValueError, match="num_full_blocks=4 exceeds the 3 block hashes"):
        pool.cache_full_blocks(blocks, block_hashes, 3, 4, kv_cache_group_id=0)


def test_groups_cache_the_same_hash_apart():
    pool = BlockPool(num_gpu_blocks=6, enable_caching=True)
    block_hash = hash_block_tokens(sha256, None, [7, 7])
    group0, group1 = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(group0, [block_hash], 0, 1, kv_cache_group_id=0)
    assert pool.get_cached_block(block_hash, [0]) == group0
    # A hit needs a block in every group asked for.
    assert pool.get_cached_block(block_hash, [1]) is None
    assert pool.get_cached_block(block_hash, [0, 1]) is None
    pool.cache_full_blocks(group1, [block_hash], 0, 1, kv_cache_group_id=1)
    assert pool.get_cached_block(block_hash, [0, 1]) == group0 + group1
    assert group1[0].block_hash == block_hash + b"\x00\x00\x00\x01"
    # A null block (a position a sliding window skipped) is passed over.
    pool.cache_full_blocks([pool.null_block], [block_hash], 0, 1, kv_cache_group_id=2)
    assert pool.null_block.block_hash is None
    assert pool.get_cached_block(block_hash, [2]) is None


def test_one_hash_may_name_two_blocks():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    block_hash = hash_block_tokens(sha256, None, [7, 7])
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(first, [block_hash], 0, 1, kv_cache_group_id=0)
    pool.cache_full_blocks(second, [block_hash], 0, 1, kv_cache_group_id=0)
    assert pool.get_cached_block(block_hash, [0]) == first
    pool.free_blocks(first + second)
    assert ids(pool.get_new_blocks(2)) == [3, 1]
    assert pool.get_cached_block(block_hash, [0]) == second
    assert ids(pool.get_new_blocks(1)) == [2]
    assert pool.get_cached_block(block_hash, [0]) is None
    assert pool.cached_block_hash_to_block == {}


def test_reset_prefix_cache_only_when_no_block_is_used():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(1)
    block_hash = hash_block_tokens(sha256, None, [1])
    pool.cache_full_blocks(blocks, [block_hash], 0, 1, kv_cache_group_id=0)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(block_hash, [0]) == blocks
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(block_hash, [0]) is None
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
