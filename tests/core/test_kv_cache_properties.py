"""Random admit / prefill / decode / preempt / free / reset sequences against KVCacheManager,
checking the block accounting after every operation (hypothesis, stateful)."""

import collections

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from vjx.core.kv_cache_manager import KVCacheManager
from vjx.core.kv_cache_utils import make_block_hash_with_group_id
from vjx.core.request import Request
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec
from vjx.sampling_params import SamplingParams

BLOCK_SIZE = 4
NUM_GPU_BLOCKS = 16
MAX_MODEL_LEN = 40
HEADS = dict(num_kv_heads=2, head_size=8, dtype="float32")
FULL = KVCacheGroupSpec(("full",), FullAttentionSpec(BLOCK_SIZE, **HEADS))
WINDOW = KVCacheGroupSpec(("window",), SlidingWindowSpec(BLOCK_SIZE, **HEADS, sliding_window=6))
SHARED = list(range(100, 132))  # prompts start with a piece of it, so prefixes are shared

prompts = st.builds(
    lambda num_shared, tail: SHARED[:num_shared] + tail,
    st.integers(0, 20),
    st.lists(st.integers(0, 2), min_size=1, max_size=8),
)


class KVCacheMachine(RuleBasedStateMachine):
    """A tiny scheduler: waiting requests are admitted through the prefix cache, running ones
    advance by chunks or one decoded token, and a request that cannot grow is preempted."""

    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = (FULL,)
    enable_caching = True

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(
            BLOCK_SIZE,
            NUM_GPU_BLOCKS,
            MAX_MODEL_LEN,
            self.enable_caching,
            kv_cache_groups=self.kv_cache_groups,
        )
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_requests = 0

    @rule(prompt=prompts, salt=st.sampled_from([None, None, "tenant"]))
    def add_request(self, prompt: list[int], salt: str | None) -> None:
        self.num_requests += 1
        request_id, params = f"r{self.num_requests}", SamplingParams()
        self.waiting.append(Request(request_id, prompt, params, None, 0.0, cache_salt=salt))

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100), chunk=st.integers(1, 64))
    def admit(self, index: int, chunk: int) -> None:
        request = self.waiting[index % len(self.waiting)]
        hits, num_hit_tokens = self.manager.get_computed_blocks(request)
        assert num_hit_tokens < request.num_tokens and num_hit_tokens % BLOCK_SIZE == 0
        for group_id, blocks in enumerate(hits.blocks):
            assert len(blocks) * BLOCK_SIZE == num_hit_tokens
            for position, block in enumerate(blocks):
                if not block.is_null:  # a hit holds exactly this request's tokens
                    key = make_block_hash_with_group_id(request.block_hashes[position], group_id)
                    assert block.block_hash == key
        num_new_tokens = min(chunk, request.num_tokens - num_hit_tokens)
        new_blocks = self.manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits)
        if new_blocks is None:
            assert request.request_id not in self.manager.req_to_blocks
            return
        assert all(not block.is_null for group in new_blocks.blocks for block in group)
        request.num_computed_tokens = num_hit_tokens + num_new_tokens
        self.waiting.remove(request)
        self.running.append(request)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), chunk=st.integers(1, 64), token_id=st.integers(0, 2))
    def advance(self, index: int, chunk: int, token_id: int) -> None:
        request = self.running[index % len(self.running)]
        if request.num_computed_tokens == request.num_tokens:
            if request.num_tokens == MAX_MODEL_LEN:
                self._finish(request)
                return
            request.append_output_token_ids(token_id)
        num_new_tokens = min(chunk, request.num_tokens - request.num_computed_tokens)
        if self.manager.allocate_slots(request, num_new_tokens) is None:
            self._finish(request)
            request.num_computed_tokens = 0
            self.waiting.append(request)  # preempted: recomputed from its tokens later
            return
        request.num_computed_tokens += num_new_tokens

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def finish(self, index: int) -> None:
        self._finish(self.running[index % len(self.running)])

    def _finish(self, request: Request) -> None:
        self.manager.free(request)
        self.running.remove(request)

    @rule()
    def reset_prefix_cache(self) -> None:
        is_reset = self.manager.reset_prefix_cache()
        assert is_reset == (not self.running)
        if is_reset:
            assert self.manager.block_pool.cached_block_hash_to_block == {}

    @invariant()
    def blocks_are_accounted_for(self) -> None:
        pool = self.manager.block_pool
        free_blocks = pool.free_block_queue.get_all_free_blocks()
        free_ids = [block.block_id for block in free_blocks]
        assert len(free_ids) == len(set(free_ids)) == pool.get_num_free_blocks()
        users = collections.Counter()
        for request in self.running:
            blocks_by_group = self.manager.get_blocks(request.request_id).blocks
            assert len({len(blocks) for blocks in blocks_by_group}) == 1
            assert len(blocks_by_group[0]) * BLOCK_SIZE >= request.num_computed_tokens
            for group_id, blocks in enumerate(blocks_by_group):
                self._check_request_blocks(request, group_id, blocks)
                users.update(block.block_id for block in blocks if not block.is_null)
        assert pool.null_block.ref_cnt == 0 and 0 not in free_ids
        for block in pool.blocks[1:]:
            assert block.ref_cnt == users[block.block_id] >= 0
            assert (block.ref_cnt == 0) == (block.block_id in set(free_ids))
        self._check_cache_index()

    def _check_request_blocks(self, request: Request, group_id: int, blocks: list) -> None:
        is_null = [block.is_null for block in blocks]
        assert is_null == sorted(is_null, reverse=True), "null blocks only lead a request's list"
        for position, block in enumerate(blocks):
            if block.block_hash is not None:
                key = make_block_hash_with_group_id(request.block_hashes[position], group_id)
                assert block.block_hash == key

    def _check_cache_index(self) -> None:
        pool = self.manager.block_pool
        num_indexed = 0
        for key, blocks in pool.cached_block_hash_to_block.items():
            assert blocks
            for block_id, block in blocks.items():
                assert block.block_id == block_id and block.block_hash == key
                num_indexed += 1
        assert num_indexed == sum(block.block_hash is not None for block in pool.blocks)
        if not self.enable_caching:
            assert num_indexed == 0

    def teardown(self) -> None:
        for request in list(self.running):
            self._finish(request)
        pool = self.manager.block_pool
        assert pool.get_num_free_blocks() == NUM_GPU_BLOCKS - 1
        assert all(block.ref_cnt == 0 for block in pool.blocks)
        assert self.manager.req_to_blocks == {} and self.manager.num_cached_block == {}


class HybridMachine(KVCacheMachine):
    kv_cache_groups = (FULL, WINDOW)


class SlidingWindowMachine(KVCacheMachine):
    kv_cache_groups = (WINDOW,)


class NoPrefixCacheMachine(KVCacheMachine):
    enable_caching = False


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("machine", [KVCacheMachine, HybridMachine, SlidingWindowMachine, NoPrefixCacheMachine])
def test_block_accounting_holds_under_random_operations(machine):
    run_state_machine_as_test(machine, settings=SETTINGS)
