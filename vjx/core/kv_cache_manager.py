"""The scheduler's interface to the KV cache: which blocks each request holds, and prefix hits."""

import dataclasses
from collections.abc import Sequence

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_coordinator import get_kv_cache_coordinator
from vjx.core.kv_cache_utils import (
    KVCacheBlock,
    PrefixCacheStats,
    get_hash_fn_by_name,
    hash_request_tokens,
)
from vjx.core.request import Request
from vjx.core.single_type_kv_cache_manager import FullAttentionManager
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec


@dataclasses.dataclass(frozen=True)
class KVCacheBlocks:
    """Blocks of one request, one list per KV cache group (in group order)."""

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)


class KVCacheManager:
    """Allocates and frees a request's blocks and finds its longest cached prefix.

    Per KV cache group, a request's blocks are a list, block i holding its tokens
    [i * block_size, (i + 1) * block_size) (or the null block where a sliding window no
    longer needs them). `kv_cache_groups` are the engine's (`KVCacheConfig.kv_cache_groups`);
    by default there is one full-attention group. The manager owns the hashing of full blocks (it extends
    `request.block_hashes`) because it owns the block size and the hash function.
    """

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        max_model_len: int,
        enable_caching: bool = True,
        *,
        kv_cache_groups: Sequence[KVCacheGroupSpec] | None = None,
        hash_algo: str = "sha256",
        num_lookahead_tokens: int = 0,
        num_unverified_tokens: int = 0,
        num_state_slots: int = 0,
    ) -> None:
        """`num_lookahead_tokens`: slots every allocation adds past the new tokens (a
        speculative proposer on the device writes its drafts' KV there after the step).
        `num_unverified_tokens`: computed tokens a request may give back (drafts in flight
        under async scheduling): a sliding window frees blocks only behind them, since the
        request's true position may be that much earlier. `num_state_slots`: the state-space
        layers' slot pool (`KVCacheConfig.num_state_slots`)."""
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}.")
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {max_model_len}.")
        if kv_cache_groups is None:
            # The allocator reads only a spec's block size and type, not its heads.
            kv_cache_groups = (KVCacheGroupSpec((), FullAttentionSpec(block_size, 1, 1, "float32")),)
        for group in kv_cache_groups:
            if group.kv_cache_spec.block_size != block_size:
                raise ValueError(
                    f"kv_cache_groups must use block_size={block_size}, got a group with "
                    f"block_size={group.kv_cache_spec.block_size}."
                )
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_lookahead_tokens = num_lookahead_tokens
        self.num_unverified_tokens = num_unverified_tokens
        self.enable_caching = enable_caching
        self.hash_fn = get_hash_fn_by_name(hash_algo)
        self.coordinator = get_kv_cache_coordinator(kv_cache_groups, num_gpu_blocks, enable_caching, num_state_slots)
        self.block_pool: BlockPool = self.coordinator.block_pool
        is_full_attention_only = all(
            isinstance(manager, FullAttentionManager) for manager in self.coordinator.single_type_managers
        )
        self._full_attention_manager = self.coordinator.single_type_managers[0] if is_full_attention_only else None
        """Group 0's manager when every group keeps all its blocks (full attention or MLA; the
        decode fast path's)."""
        self.empty_kv_cache_blocks = KVCacheBlocks(self.coordinator.empty_blocks())
        """No blocks in any group: one shared instance (callers never mutate it), since most
        decode steps allocate nothing for most requests."""

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.block_pool.prefix_cache_stats

    @property
    def req_to_blocks(self) -> dict[str, list[KVCacheBlock]]:
        """Group 0's blocks by request: every request the manager holds blocks for."""
        return self.coordinator.single_type_managers[0].req_to_blocks

    @property
    def num_cached_block(self) -> dict[str, int]:
        """Group 0's count, per request, of its first blocks already in the prefix cache."""
        return self.coordinator.single_type_managers[0].num_cached_block

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of the request, per group, and its token count.

        The hit stops at least one token short of the request's end: the last token must be
        computed again for its logits. For a new request that caps the hit at
        `prompt_len - 1` tokens; a preempted one may also hit its own output blocks. A
        request that wants prompt logprobs gets no hit: every prompt token must be computed.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return KVCacheBlocks(self.coordinator.empty_blocks()), 0
        self._update_block_hashes(request)
        hit_blocks, num_computed_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        self.block_pool.record_prefix_cache_lookup(request.num_tokens, num_computed_tokens)
        return KVCacheBlocks(hit_blocks), num_computed_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        """Give the request slots for `num_new_tokens` more tokens; None if the pool is short.

        The request's tokens, in order, and the blocks that hold them (per group):

            tokens | computed            | prefix hits         | num_new_tokens |
            blocks | held by the request | new_computed_blocks | new blocks     |

        (the last block the request holds may have room for some of the new tokens).
        `request.num_computed_tokens` tokens are computed; `num_new_computed_tokens` more were
        found in the prefix cache (`new_computed_blocks`, only for a request that holds no
        blocks yet); `num_new_tokens` are computed this step. Blocks a sliding window no
        longer needs are freed first. Hit blocks that no request holds come out of the free
        queue, so they count against the free blocks like new ones. Either every block needed
        is granted or no block is taken. Blocks that become full with this step's tokens are
        entered in the prefix cache. Returns the new blocks, per group.
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be at least 1, got {num_new_tokens}.")
        # Lookahead slots count as new tokens; caching stops at the request's known tokens anyway.
        num_new_tokens += self.num_lookahead_tokens
        request_id = request.request_id
        coordinator = self.coordinator
        if new_computed_blocks is None and self._holds_slots_for(request, num_new_tokens):
            return self.empty_kv_cache_blocks
        if new_computed_blocks is None:
            hit_blocks = coordinator.empty_blocks()
        else:
            hit_blocks = new_computed_blocks.blocks
            if request_id in self.num_cached_block and any(hit_blocks):
                raise ValueError(
                    f"new_computed_blocks must be empty for request {request_id!r}, which "
                    f"already holds {len(self.req_to_blocks[request_id])} blocks."
                )
        coordinator.remove_skipped_blocks(request_id, max(request.num_computed_tokens - self.num_unverified_tokens, 0))
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = min(num_computed_tokens + num_new_tokens, self.max_model_len)
        num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(request_id, num_tokens_need_slot, hit_blocks)
        if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
            return None
        # Touch the hits before popping new blocks, so the pop cannot evict them.
        for blocks in hit_blocks:
            self.block_pool.touch(blocks)
        coordinator.save_new_computed_blocks(request_id, hit_blocks)
        new_blocks = coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        if self.enable_caching:
            # Only tokens known now: blocks waiting on tokens not sampled yet stay uncached.
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, request.num_tokens)
            if num_tokens_to_cache >= (len(request.block_hashes) + 1) * self.block_size:
                self._update_block_hashes(request)
            coordinator.cache_blocks(request_id, request.block_hashes, num_tokens_to_cache)
        return KVCacheBlocks(new_blocks)

    def _holds_slots_for(self, request: Request, num_new_tokens: int) -> bool:
        """The common decode step: the held blocks cover the new tokens and none fills up.

        Then there is nothing to allocate, free or cache, and the general path is skipped.
        """
        manager = self._full_attention_manager
        blocks = None if manager is None else manager.req_to_blocks.get(request.request_id)
        if blocks is None:
            return False
        # Plain comparisons rather than min(): this runs for every request every step.
        end = request.num_computed_tokens + num_new_tokens
        if end > self.max_model_len:
            end = self.max_model_len
        if end > len(blocks) * self.block_size:
            return False
        if not self.enable_caching:
            return True
        num_tokens = len(request.all_token_ids)
        num_full_blocks = (end if end < num_tokens else num_tokens) // self.block_size
        return num_full_blocks <= manager.num_cached_block[request.request_id]

    def _update_block_hashes(self, request: Request) -> None:
        request.block_hashes.extend(
            hash_request_tokens(
                self.hash_fn,
                self.block_size,
                request.all_token_ids,
                request.block_hashes,
                request.cache_salt,
                None if (lora := request.lora_request) is None else (lora.lora_name, lora.lora_int_id),
            )
        )

    def free(self, request: Request) -> None:
        """Release the request's blocks, group by group, last block first in each."""
        self.coordinator.free(request.request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> tuple[int, ...]:
        """Per group, how many leading blocks of this running request every running request holds.

        The runner may compute attention over that shared prefix once (cascade attention).
        """
        return self.coordinator.get_num_common_prefix_blocks(request_id, num_running_requests)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any request holds a block."""
        return self.block_pool.reset_prefix_cache()
