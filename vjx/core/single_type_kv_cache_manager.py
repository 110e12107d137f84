"""One KV cache group's blocks for every request, under one attention type's rules.

The rules that differ by attention type are few: which cached prefixes are usable (a hit),
which held blocks are no longer needed (sliding window), and which blocks every running
request shares (cascade attention). Each type is a small strategy class; everything else
(counting, allocating, caching and freeing a request's blocks) is shared.
"""

import abc
import itertools
from collections.abc import Sequence

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_utils import BlockHash, KVCacheBlock
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec


class SingleTypeKVCacheManager(abc.ABC):
    """The blocks of one KV cache group: request i's block j holds its tokens
    [j * block_size, (j + 1) * block_size), or is the null block where they are not needed."""

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, kv_cache_group_id: int):
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.null_block = block_pool.null_block
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        """Per request, how many of its first blocks are in the prefix cache already."""

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        """Free blocks that giving the request `num_tokens` slots would take.

        Hit blocks no request holds sit in the free queue: touching them takes them out, so
        they count like new blocks.
        """
        num_required_blocks = -(-num_tokens // self.block_size)
        num_held_blocks = len(self.req_to_blocks.get(request_id, ()))
        num_new_blocks = num_required_blocks - len(new_computed_blocks) - num_held_blocks
        num_evictable_computed_blocks = sum(
            1 for block in new_computed_blocks if block.ref_cnt == 0 and not block.is_null
        )
        return max(0, num_new_blocks) + num_evictable_computed_blocks

    def save_new_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock]) -> None:
        """Start a new request's block list with its prefix-cache hits (already touched)."""
        if request_id in self.num_cached_block:
            if new_computed_blocks:
                raise ValueError(
                    f"new_computed_blocks must be empty for request {request_id!r}, which "
                    f"already holds {len(self.req_to_blocks[request_id])} blocks."
                )
            return
        self.req_to_blocks[request_id] = list(new_computed_blocks)
        self.num_cached_block[request_id] = len(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the request's blocks to hold `num_tokens` tokens; return the added blocks."""
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = -(-num_tokens // self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash], num_tokens: int):
        """Enter the request's blocks that the first `num_tokens` tokens fill in the cache."""
        num_cached_blocks = self.num_cached_block[request_id]
        num_full_blocks = num_tokens // self.block_size
        if num_full_blocks <= num_cached_blocks:
            return
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[request_id],
            block_hashes,
            num_cached_blocks,
            num_full_blocks,
            self.kv_cache_group_id,
        )
        self.num_cached_block[request_id] = num_full_blocks

    def free(self, request_id: str) -> None:
        """Release the request's blocks, last block first (see `BlockPool.free_blocks`)."""
        req_blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(req_blocks))
        self.num_cached_block.pop(request_id, None)

    @abc.abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, kv_cache_group_ids: Sequence[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """Per group in `kv_cache_group_ids` (all of this type), the cached blocks of the
        longest prefix of at most `max_length` tokens whose K/V this type's layers can use;
        blocks they do not need are the null block."""

    @abc.abstractmethod
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the request's blocks that no token from `num_computed_tokens` on will read."""

    @abc.abstractmethod
    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        """Leading blocks of this running request that every running request holds."""


class FullAttentionManager(SingleTypeKVCacheManager):
    """Every block is needed until the request ends; any cached prefix is a hit (full
    attention and MLA layers)."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, kv_cache_group_ids: Sequence[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        computed_blocks = tuple([] for _ in kv_cache_group_ids)
        max_num_blocks = max_length // self.block_size
        # Hashes chain, so past the first miss no later block can be cached for this prefix.
        for block_hash in itertools.islice(block_hashes, max_num_blocks):
            cached_blocks = self.block_pool.get_cached_block(block_hash, kv_cache_group_ids)
            if cached_blocks is None:
                break
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed.append(cached)
        return computed_blocks

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        return

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        # Only running requests hold blocks, so a block all of them share has this ref count.
        num_common_blocks = 0
        for block in self.req_to_blocks.get(request_id, ()):
            if block.ref_cnt != num_running_requests:
                break
            num_common_blocks += 1
        return num_common_blocks


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A token reads only the last `sliding_window` positions, its own included.

    A prefix of n blocks is a hit when the blocks covering the window of its next token are
    cached (the ones before can be null), or when all n blocks are cached. Blocks that fall
    out of the window of the next token to compute go back to the pool.
    """

    def __init__(self, kv_cache_spec: SlidingWindowSpec, block_pool: BlockPool, kv_cache_group_id: int):
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id)
        self.sliding_window = kv_cache_spec.sliding_window
        # The next token is part of its own window: it needs sliding_window - 1 cached ones.
        self.sliding_window_contiguous_blocks = -(-(self.sliding_window - 1) // self.block_size)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, kv_cache_group_ids: Sequence[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        max_num_blocks = max_length // self.block_size
        computed_blocks = tuple([self.null_block] * max_num_blocks for _ in kv_cache_group_ids)
        num_contiguous_blocks = 0
        # From the right: the first window of contiguous hits found gives the longest prefix.
        for i in range(max_num_blocks - 1, -1, -1):
            cached_blocks = self.block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if cached_blocks is None:
                num_contiguous_blocks = 0
                continue
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed[i] = cached
            num_contiguous_blocks += 1
            if num_contiguous_blocks >= self.sliding_window_contiguous_blocks:
                for computed in computed_blocks:
                    del computed[i + num_contiguous_blocks :]
                return computed_blocks
        # No full window: only a run of hits from the first block is usable.
        for computed in computed_blocks:
            del computed[num_contiguous_blocks:]
        return computed_blocks

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        first_useful_token = num_computed_tokens - self.sliding_window + 1
        num_skipped_blocks = first_useful_token // self.block_size
        removed_blocks = []
        for i in range(num_skipped_blocks - 1, -1, -1):
            if blocks[i].is_null:
                break  # earlier calls already nulled this block and every one before it
            removed_blocks.append(blocks[i])
            blocks[i] = self.null_block
        self.block_pool.free_blocks(removed_blocks)

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        # A shared prefix here is mostly null blocks, which cascade attention cannot use.
        return 0


class MambaManager(SingleTypeKVCacheManager):
    """A state-space layer's group: each request holds one state slot, from the block pool's
    slot pool rather than its blocks, from its first step to its end. A state covers every
    token so far, so it is never shared: no prefix is a hit and nothing is cached."""

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        return 0  # a running request always finds a slot: there is one for each

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks[request_id]
        if req_blocks:
            return []
        req_blocks.append(self.block_pool.get_new_state_slot())
        return list(req_blocks)

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash], num_tokens: int):
        return

    def free(self, request_id: str) -> None:
        for slot in self.req_to_blocks.pop(request_id, []):
            self.block_pool.free_state_slot(slot)
        self.num_cached_block.pop(request_id, None)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, kv_cache_group_ids: Sequence[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple([] for _ in kv_cache_group_ids)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        return

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        return 0


_MANAGER_BY_SPEC = {
    FullAttentionSpec: FullAttentionManager,
    MLAAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    MambaSpec: MambaManager,
}


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec, block_pool: BlockPool, kv_cache_group_id: int
) -> SingleTypeKVCacheManager:
    return _MANAGER_BY_SPEC[type(kv_cache_spec)](kv_cache_spec, block_pool, kv_cache_group_id)
