"""The pool of KV cache blocks: ref counts, the LRU free queue and the prefix-cache index."""

import collections
from collections.abc import Iterable, Sequence

from vjx.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    PrefixCacheStats,
    make_block_hash_with_group_id,
)


class BlockPool:
    """Every KV block of the device cache, by id; plain Python, no device.

    Block 0 is the null (scratch) block: the runner writes padding tokens' K/V there and a
    sliding-window request points its out-of-window positions at it, so it is never in the
    free queue, never handed out and never ref-counted. Blocks 1..N-1 start free, in id order.

    A full block of a request is entered in the prefix cache under its chained hash (and its
    KV cache group) and stays there after the request frees it: a later request with the same
    prefix takes it back out of the free queue (`touch`). Its hash is dropped only when the
    free queue hands the block out for reuse, so the cache always holds the most recently
    freed prefixes.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, num_state_slots: int = 0) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be at least 2 (block 0 is the reserved null block), got {num_gpu_blocks}."
            )
        self.num_state_slots = num_state_slots
        self.free_state_slots = collections.deque(KVCacheBlock(block_id=i) for i in range(1, num_state_slots))
        """The state-space layers' slots (`KVCacheConfig.num_state_slots`), slot 0 kept as scratch:
        a pool of their own beside the blocks, never cached, handed out in id order."""
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[1:])
        self.cached_block_hash_to_block: dict[BlockHashWithGroupId, dict[int, KVCacheBlock]] = {}
        """Hash -> the cached blocks holding it, by id. Two requests that computed the same
        prefix in the same step each cache their own copy, so one hash may name several."""
        self.prefix_cache_stats = PrefixCacheStats()

    def get_cached_block(self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """One cached block per group for `block_hash`, or None unless every group has one."""
        cached_blocks = []
        for group_id in kv_cache_group_ids:
            key = make_block_hash_with_group_id(block_hash, group_id)
            blocks = self.cached_block_hash_to_block.get(key)
            if not blocks:
                return None
            cached_blocks.append(next(iter(blocks.values())))
        return cached_blocks

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        kv_cache_group_id: int,
    ) -> None:
        """Enter `blocks[num_cached_blocks:num_full_blocks]` under the same slice of hashes.

        `blocks` and `block_hashes` are one request's in one group, from its first block; the
        first `num_cached_blocks` are in the cache already. Null blocks (positions a sliding
        window skipped) hold no K/V and are passed over.
        """
        if len(block_hashes) < num_full_blocks:
            raise ValueError(
                f"cache_full_blocks: num_full_blocks={num_full_blocks} exceeds the "
                f"{len(block_hashes)} block hashes given."
            )
        cache = self.cached_block_hash_to_block
        group_id_bytes = kv_cache_group_id.to_bytes(4, "big")
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            if block.block_hash is not None:
                raise ValueError(f"cache_full_blocks: block {block.block_id} is already cached.")
            key = BlockHashWithGroupId(block_hashes[i] + group_id_bytes)
            block.block_hash = key
            same_hash = cache.get(key)
            if same_hash is None:
                cache[key] = {block.block_id: block}
            else:
                same_hash[block.block_id] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue, each with ref_cnt 1.

        A popped block that was cached leaves the prefix cache now: this is the only eviction.
        """
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(
                f"get_new_blocks: num_blocks={num_blocks} exceeds the "
                f"{self.free_block_queue.num_free_blocks} free blocks."
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if block.block_hash is not None:
                self._evict_cached_block(block)
            block.ref_cnt = 1
        return blocks

    def _evict_cached_block(self, block: KVCacheBlock) -> None:
        same_hash = self.cached_block_hash_to_block[block.block_hash]
        del same_hash[block.block_id]
        if not same_hash:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference to cache-hit blocks, pulling the unused ones out of the free queue."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference to each block; unused ones join the free queue tail in order.

        Callers pass a request's blocks last first, so its tail blocks (the prefixes least
        likely to be shared) are evicted before its head blocks.
        """
        unused_blocks = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt < 1:
                raise ValueError(f"free_blocks: block {block.block_id} is not in use.")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                unused_blocks.append(block)
        self.free_block_queue.append_n(unused_blocks)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any request holds a block."""
        num_used_blocks = self.num_gpu_blocks - 1 - self.get_num_free_blocks()
        if num_used_blocks > 0:
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.block_hash = None
        self.prefix_cache_stats.num_resets += 1
        return True

    def record_prefix_cache_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        stats = self.prefix_cache_stats
        stats.num_requests += 1
        stats.num_queried_tokens += num_queried_tokens
        stats.num_hit_tokens += num_hit_tokens

    def get_new_state_slot(self) -> KVCacheBlock:
        """A free state slot; one is free for every running request (there are max_num_seqs)."""
        if not self.free_state_slots:
            raise ValueError(f"get_new_state_slot: all {self.num_state_slots - 1} state slots are in use.")
        return self.free_state_slots.popleft()

    def free_state_slot(self, slot: KVCacheBlock) -> None:
        self.free_state_slots.append(slot)

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) that requests hold."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)
