"""MambaSpec: a state slot per request in its page size, held for the request's life whatever
its length, from a slot pool of its own beside the blocks; no prefix-cache hit through a
state layer."""

import pytest

from vjx.config import CacheConfig, SchedulerConfig
from vjx.core.kv_cache_coordinator import HybridKVCacheCoordinator, UnitaryKVCacheCoordinator
from vjx.core.kv_cache_manager import KVCacheManager
from vjx.core.request import Request
from vjx.core.sched.scheduler import Scheduler
from vjx.core.single_type_kv_cache_manager import MambaManager
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vjx.sampling_params import SamplingParams

MAMBA = KVCacheGroupSpec(("layers.0",), MambaSpec(block_size=4, shapes=((3, 24), (2, 4, 8)), dtype="float32"))
ATTENTION = KVCacheGroupSpec(
    ("layers.1",), FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype="float32")
)
PROMPT = list(range(1, 11))  # 10 tokens: two full blocks of 4 and a partial one


def make_request(request_id: str, prompt_token_ids: list[int]) -> Request:
    return Request(request_id, prompt_token_ids, SamplingParams(), None, arrival_time=0.0)


def schedule(manager: KVCacheManager, request: Request, num_tokens: int) -> tuple[list[int], ...]:
    """Gives the request `num_tokens` more tokens (its hits first, on its first step)."""
    hits, num_hit_tokens = manager.get_computed_blocks(request) if request.num_computed_tokens == 0 else (None, 0)
    request.num_computed_tokens += num_hit_tokens
    new_blocks = manager.allocate_slots(request, num_tokens - num_hit_tokens, num_hit_tokens, hits)
    request.num_computed_tokens += num_tokens - num_hit_tokens
    return new_blocks.get_block_ids()


def test_page_holds_every_state_of_a_slot():
    # Mamba2-2.7B's layer: conv over 5120 + 2 * 128 channels, 80 heads of 64 x 128 states.
    spec = MambaSpec(block_size=16, shapes=((3, 5376), (80, 64, 128)), dtype="bfloat16")
    assert spec.state_size == 3 * 5376 + 80 * 64 * 128
    assert spec.page_size_bytes == 2 * spec.state_size
    # The slot is not a block of the pool: a request's blocks are its attention blocks only.
    assert spec.max_num_blocks_per_request(max_model_len=100_000, max_num_batched_tokens=8192) == 0
    config = KVCacheConfig(8, (MAMBA, ATTENTION), num_state_slots=5)
    assert config.has_state_layers
    assert config.max_num_blocks_per_request(max_model_len=32, max_num_batched_tokens=8) == 8


def test_rejects_bad_fields():
    with pytest.raises(ValueError, match="num_state_slots must be at least 2 .* with state-space layers, got 0"):
        KVCacheConfig(8, (MAMBA, ATTENTION))
    with pytest.raises(ValueError, match=r"shapes must be non-empty shapes of positive sizes, got \(\(3, 0\),\)"):
        MambaSpec(16, ((3, 0),), "float32")
    with pytest.raises(ValueError, match="dtype must be one of .* for a Mamba state, got 'float8_e4m3fn'"):
        MambaSpec(16, ((3, 8),), "float8_e4m3fn")


def test_a_request_holds_one_slot_whatever_its_length():
    manager = KVCacheManager(
        block_size=4, num_gpu_blocks=2, max_model_len=64, kv_cache_groups=[MAMBA], num_state_slots=4
    )
    assert isinstance(manager.coordinator, UnitaryKVCacheCoordinator)
    assert type(manager.coordinator.single_type_managers[0]) is MambaManager
    assert manager._full_attention_manager is None  # no decode fast path: it reads blocks per token
    a = make_request("a", PROMPT)
    assert schedule(manager, a, 6) == ([1],)
    assert schedule(manager, a, 4) == ([],)
    a.append_output_token_ids(list(range(20, 40)))
    assert schedule(manager, a, 20) == ([],)
    assert manager.get_block_ids("a") == ([1],)
    # Three slots for three running requests; the block pool (one spare block) is never drawn on.
    b, c = (make_request(name, PROMPT) for name in "bc")
    assert schedule(manager, b, 10) == ([2],) and schedule(manager, c, 10) == ([3],)
    assert manager.block_pool.get_num_free_blocks() == 1
    manager.free(a)
    d = make_request("d", PROMPT)
    assert schedule(manager, d, 10) == ([1],)


def test_a_state_is_never_a_prefix_hit():
    manager = KVCacheManager(
        block_size=4, num_gpu_blocks=2, max_model_len=64, kv_cache_groups=[MAMBA], num_state_slots=4
    )
    a = make_request("a", PROMPT)
    schedule(manager, a, 10)
    manager.free(a)
    again = make_request("again", PROMPT)
    hits, num_hit_tokens = manager.get_computed_blocks(again)
    assert (hits.get_block_ids(), num_hit_tokens) == (([],), 0)


def test_hybrid_hits_nothing_while_attention_blocks_grow():
    manager = KVCacheManager(
        block_size=4, num_gpu_blocks=16, max_model_len=64, kv_cache_groups=[MAMBA, ATTENTION], num_state_slots=3
    )
    assert isinstance(manager.coordinator, HybridKVCacheCoordinator)
    a = make_request("a", PROMPT)
    assert schedule(manager, a, 10) == ([1], [1, 2, 3])
    a.append_output_token_ids([50, 51, 52])
    assert schedule(manager, a, 3) == ([], [4])
    # The attention group caches the prompt's full blocks, but the state layer cannot resume
    # mid-prompt, so the hybrid's hit is empty.
    b = make_request("b", PROMPT)
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit_tokens) == (([], []), 0)
    assert schedule(manager, b, 10) == ([2], [5, 6, 7])
    manager.free(a)
    manager.free(b)
    assert manager.block_pool.get_num_free_blocks() == 15
    assert len(manager.block_pool.free_state_slots) == 2


def test_the_scheduler_wants_a_slot_for_every_running_request():
    scheduler_config = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=True
    )
    cache_config = CacheConfig(
        block_size=4, gpu_memory_utilization=0.9, num_gpu_blocks_override=None, enable_prefix_caching=True
    )
    with pytest.raises(ValueError, match=r"num_state_slots=4 must be at least max_num_seqs \+ 1 \(5\)"):
        Scheduler(scheduler_config, cache_config, KVCacheConfig(16, (MAMBA, ATTENTION), num_state_slots=4))
    scheduler = Scheduler(scheduler_config, cache_config, KVCacheConfig(16, (MAMBA, ATTENTION), num_state_slots=5))
    assert len(scheduler.kv_cache_manager.block_pool.free_state_slots) == 4
