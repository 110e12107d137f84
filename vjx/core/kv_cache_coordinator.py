"""One request-level view over the KV cache groups: a manager per group, one block pool.

Every group gives a request the same number of blocks (they share the block size), so the
coordinator asks each group's manager and sums or gathers. The variants differ only in how a
prefix-cache hit is found: none (caching off), one attention type (Unitary), or several whose
hit must be valid for every one of them (Hybrid).
"""

import abc
from collections.abc import Sequence

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_utils import BlockHash, KVCacheBlock
from vjx.core.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
    get_manager_for_kv_cache_spec,
)
from vjx.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec


class KVCacheCoordinator(abc.ABC):
    """The per-group managers of every KV cache group, over one shared `BlockPool`."""

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_gpu_blocks: int,
        enable_caching: bool,
        num_state_slots: int = 0,
    ) -> None:
        if not kv_cache_groups:
            raise ValueError("kv_cache_groups must hold at least one group, got none.")
        block_sizes = sorted({group.kv_cache_spec.block_size for group in kv_cache_groups})
        if len(block_sizes) > 1:
            raise ValueError(f"kv_cache_groups must share one block_size, got {block_sizes}.")
        self.kv_cache_groups = tuple(kv_cache_groups)
        self.block_size = block_sizes[0]
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, num_state_slots)
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kv_cache_spec(group.kv_cache_spec, self.block_pool, group_id)
            for group_id, group in enumerate(kv_cache_groups)
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
    ) -> int:
        return sum(
            manager.get_num_blocks_to_allocate(request_id, num_tokens, blocks)
            for manager, blocks in zip(self.single_type_managers, new_computed_blocks)
        )

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: tuple[Sequence[KVCacheBlock], ...]
    ) -> None:
        for manager, blocks in zip(self.single_type_managers, new_computed_blocks):
            manager.save_new_computed_blocks(request_id, blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> tuple[list[KVCacheBlock], ...]:
        return tuple(manager.allocate_new_blocks(request_id, num_tokens) for manager in self.single_type_managers)

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash], num_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.cache_blocks(request_id, block_hashes, num_tokens)

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> tuple[int, ...]:
        return tuple(
            manager.get_num_common_prefix_blocks(request_id, num_running_requests)
            for manager in self.single_type_managers
        )

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(manager.req_to_blocks.get(request_id, []) for manager in self.single_type_managers)

    def empty_blocks(self) -> tuple[list[KVCacheBlock], ...]:
        return tuple([] for _ in self.single_type_managers)

    @abc.abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Per group, the cached blocks of the longest prefix of at most
        `max_cache_hit_length` tokens usable by every group; and that prefix's length."""


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: nothing is ever a hit."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        return self.empty_blocks(), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Every group has the same attention spec (the common case: one full-attention group)."""

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_gpu_blocks: int,
        enable_caching: bool,
        num_state_slots: int = 0,
    ) -> None:
        super().__init__(kv_cache_groups, num_gpu_blocks, enable_caching, num_state_slots)
        specs = {group.kv_cache_spec for group in kv_cache_groups}
        if len(specs) > 1:
            raise ValueError(
                f"kv_cache_groups must share one kv_cache_spec for a unitary coordinator, got {len(specs)} specs."
            )
        self._group_ids = tuple(range(len(kv_cache_groups)))

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        hit_blocks = self.single_type_managers[0].find_longest_cache_hit(
            block_hashes, max_cache_hit_length, self._group_ids
        )
        return hit_blocks, len(hit_blocks[0]) * self.block_size


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Groups of several attention types (e.g. sliding-window and full layers, Gemma 3).

    A prefix is a hit only if every type can use it. Full attention can use any prefix of a
    hit, sliding window cannot (a shorter prefix needs other blocks in its window), so each
    type in turn finds its longest hit no longer than the others found, until a whole round
    agrees. Full attention goes first: its hit bounds the rest cheaply.
    """

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_gpu_blocks: int,
        enable_caching: bool,
        num_state_slots: int = 0,
    ) -> None:
        super().__init__(kv_cache_groups, num_gpu_blocks, enable_caching, num_state_slots)
        group_ids_by_spec: dict[KVCacheSpec, list[int]] = {}
        for group_id, group in enumerate(kv_cache_groups):
            group_ids_by_spec.setdefault(group.kv_cache_spec, []).append(group_id)
        attention_groups = [(self.single_type_managers[ids[0]], tuple(ids)) for ids in group_ids_by_spec.values()]
        self.attention_groups = tuple(
            sorted(attention_groups, key=lambda group: not isinstance(group[0], FullAttentionManager))
        )
        """(a manager of the type, the ids of the groups of that spec), full attention (and
        MLA) first."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        hit_length = max_cache_hit_length
        while True:
            hits_by_type = []
            for manager, group_ids in self.attention_groups:
                hit_blocks = manager.find_longest_cache_hit(block_hashes, hit_length, group_ids)
                hit_length = len(hit_blocks[0]) * self.block_size
                hits_by_type.append(hit_blocks)
            # Each round only shortens the hit, so this ends (at the latest at length 0).
            if all(len(hit[0]) * self.block_size == hit_length for hit in hits_by_type):
                break
        hit_blocks_by_group: list[list[KVCacheBlock]] = [[] for _ in self.single_type_managers]
        for (_, group_ids), hit_blocks in zip(self.attention_groups, hits_by_type):
            for group_id, blocks in zip(group_ids, hit_blocks):
                hit_blocks_by_group[group_id] = blocks
        return tuple(hit_blocks_by_group), hit_length


def get_kv_cache_coordinator(
    kv_cache_groups: Sequence[KVCacheGroupSpec], num_gpu_blocks: int, enable_caching: bool, num_state_slots: int = 0
) -> KVCacheCoordinator:
    args = (kv_cache_groups, num_gpu_blocks, enable_caching, num_state_slots)
    if not enable_caching:
        return NoPrefixCacheCoordinator(*args)
    if len({group.kv_cache_spec for group in kv_cache_groups}) == 1:
        return UnitaryKVCacheCoordinator(*args)
    return HybridKVCacheCoordinator(*args)
