"""The scheduler's interface to the KV cache: which blocks each request holds, and prefix hits."""

import dataclasses

from vjx.core.block_pool import BlockPool
from vjx.core.kv_cache_utils import KVCacheBlock, PrefixCacheStats, hash_request_tokens
from vjx.core.request import Request


@dataclasses.dataclass(frozen=True)
class KVCacheBlocks:
    """Blocks of one request, one list per KV cache group (a single full-attention group now)."""

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)


class KVCacheManager:
    """Allocates and frees a request's blocks and finds its longest cached prefix.

    One full-attention group: a request's blocks are a list, block i holding its tokens
    [i * block_size, (i + 1) * block_size). The manager owns the hashing of full blocks
    (it extends `request.block_hashes`) because it owns the block size.
    """

    def __init__(
        self, block_size: int, num_gpu_blocks: int, max_model_len: int, enable_caching: bool = True
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}.")
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {max_model_len}.")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        """Per request, how many of its first blocks are in the prefix cache already."""

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.block_pool.prefix_cache_stats

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest run of cached full blocks that starts the request, and its token count.

        The hit stops at least one token short of the request's end: the last token must be
        computed again for its logits. For a new request that caps the hit at
        `prompt_len - 1` tokens; a preempted one may also hit its own output blocks.
        """
        if not self.enable_caching:
            return KVCacheBlocks(([],)), 0
        self._update_block_hashes(request)
        max_num_hit_blocks = (request.num_tokens - 1) // self.block_size
        computed_blocks = []
        for block_hash in request.block_hashes[:max_num_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            computed_blocks.append(block)
        num_computed_tokens = len(computed_blocks) * self.block_size
        self.block_pool.record_prefix_cache_lookup(request.num_tokens, num_computed_tokens)
        return KVCacheBlocks((computed_blocks,)), num_computed_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        """Give the request slots for `num_new_tokens` more tokens; None if the pool is short.

        The request's tokens, in order, and the blocks that hold them:

            tokens | computed            | prefix hits         | num_new_tokens |
            blocks | held by the request | new_computed_blocks | new blocks     |

        (the last block the request holds may have room for some of the new tokens).
        `request.num_computed_tokens` tokens are computed; `num_new_computed_tokens` more were
        found in the prefix cache (`new_computed_blocks`, only for a request that holds no
        blocks yet); `num_new_tokens` are computed this step. Hit blocks that no request holds
        come out of the free queue, so they count against the free blocks like new ones.
        Either every block needed is granted or nothing changes. Blocks that become full
        with this step's tokens are entered in the prefix cache.
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be at least 1, got {num_new_tokens}.")
        hit_blocks = new_computed_blocks.blocks[0] if new_computed_blocks else []
        request_id = request.request_id
        req_blocks = self.req_to_blocks.get(request_id, [])
        if hit_blocks and req_blocks:
            raise ValueError(
                f"new_computed_blocks must be empty for request {request_id!r}, which already "
                f"holds {len(req_blocks)} blocks."
            )
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = min(num_computed_tokens + num_new_tokens, self.max_model_len)
        num_required_blocks = -(-num_tokens_need_slot // self.block_size)
        num_new_blocks = max(0, num_required_blocks - len(hit_blocks) - len(req_blocks))
        num_evictable_hit_blocks = sum(1 for block in hit_blocks if block.ref_cnt == 0)
        if num_new_blocks + num_evictable_hit_blocks > self.block_pool.get_num_free_blocks():
            return None
        # Touch the hits before popping new blocks, so the pop cannot evict them.
        self.block_pool.touch(hit_blocks)
        if request_id not in self.req_to_blocks:
            self.req_to_blocks[request_id] = list(hit_blocks)
            self.num_cached_block[request_id] = len(hit_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        self.req_to_blocks[request_id].extend(new_blocks)
        if self.enable_caching:
            # Only tokens known now: blocks waiting on tokens not sampled yet stay uncached.
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, request.num_tokens)
            self._cache_blocks(request, num_tokens_to_cache)
        return KVCacheBlocks((new_blocks,))

    def _cache_blocks(self, request: Request, num_tokens: int) -> None:
        num_full_blocks = num_tokens // self.block_size
        num_cached_blocks = self.num_cached_block[request.request_id]
        if num_full_blocks <= num_cached_blocks:
            return
        self._update_block_hashes(request)
        blocks = self.req_to_blocks[request.request_id]
        self.block_pool.cache_full_blocks(
            blocks, request.block_hashes, num_cached_blocks, num_full_blocks
        )
        self.num_cached_block[request.request_id] = num_full_blocks

    def _update_block_hashes(self, request: Request) -> None:
        request.block_hashes.extend(
            hash_request_tokens(self.block_size, request.all_token_ids, request.block_hashes)
        )

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (see `BlockPool.free_blocks`)."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return KVCacheBlocks((self.req_to_blocks.get(request_id, []),)).get_block_ids()

    def get_num_common_prefix_blocks(
        self, request_id: str, num_running_requests: int
    ) -> tuple[int, ...]:
        """Per group, how many leading blocks of this running request every running request holds.

        Only running requests hold blocks, so a block shared by all of them has a ref count
        equal to their number; the runner may use the shared prefix for cascade attention.
        """
        num_common_blocks = 0
        for block in self.req_to_blocks.get(request_id, []):
            if block.ref_cnt != num_running_requests:
                break
            num_common_blocks += 1
        return (num_common_blocks,)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
