"""MLAAttentionSpec: one latent per token in its page size, and blocks kept like full attention."""

import pytest

from vjx.core.kv_cache_coordinator import HybridKVCacheCoordinator, UnitaryKVCacheCoordinator
from vjx.core.kv_cache_manager import KVCacheManager
from vjx.core.request import Request
from vjx.core.single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager
from vjx.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    get_kv_cache_groups,
)
from vjx.sampling_params import SamplingParams

MLA = KVCacheGroupSpec(
    ("layers.0",), MLAAttentionSpec(block_size=4, kv_lora_rank=8, qk_rope_head_dim=4, dtype="float32")
)
WINDOW = KVCacheGroupSpec(
    ("layers.1",), SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=8, dtype="float32", sliding_window=8)
)
PROMPT = list(range(1, 11))  # 10 tokens: two full blocks of 4 and a partial one


def make_request(request_id: str, prompt_token_ids: list[int]) -> Request:
    return Request(request_id, prompt_token_ids, SamplingParams(), None, arrival_time=0.0)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def schedule_prompt(manager: KVCacheManager, request: Request) -> tuple[list[int], ...]:
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    new_blocks = manager.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, hits)
    request.num_computed_tokens = request.num_tokens
    return new_blocks.get_block_ids()


def test_page_holds_one_latent_per_token():
    deepseek = MLAAttentionSpec(block_size=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")
    assert deepseek.latent_dim == 576
    assert deepseek.page_size_bytes == 16 * 576 * 2
    assert MLAAttentionSpec(16, 512, 64, "float8_e4m3fn").page_size_bytes == 16 * 576
    # Half of one KV head of the latent's width: no separate key and value.
    assert 2 * deepseek.page_size_bytes == FullAttentionSpec(16, 1, 576, "bfloat16").page_size_bytes
    assert deepseek.max_num_blocks_per_request(max_model_len=100, max_num_batched_tokens=8) == 7


def test_rejects_bad_fields():
    with pytest.raises(ValueError, match="kv_lora_rank must be at least 1 and qk_rope_head_dim at least 0, got 0"):
        MLAAttentionSpec(16, 0, 64, "bfloat16")
    with pytest.raises(ValueError, match="dtype must be one of .* got 'int4'"):
        MLAAttentionSpec(16, 512, 64, "int4")
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        MLAAttentionSpec(0, 512, 64, "bfloat16")


def test_equal_specs_share_a_group():
    spec = MLA.kv_cache_spec
    groups = get_kv_cache_groups({"layers.0": spec, "layers.1": spec})
    assert groups == (KVCacheGroupSpec(("layers.0", "layers.1"), spec),)


def test_allocates_frees_and_hits_like_full_attention():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=11, max_model_len=32, kv_cache_groups=[MLA])
    assert isinstance(manager.coordinator, UnitaryKVCacheCoordinator)
    assert type(manager.coordinator.single_type_managers[0]) is FullAttentionManager
    # Every group keeps all its blocks, so the decode fast path applies.
    assert manager._full_attention_manager is manager.coordinator.single_type_managers[0]
    a = make_request("a", PROMPT)
    assert schedule_prompt(manager, a) == ([1, 2, 3],)
    assert manager.num_cached_block == {"a": 2}
    b = make_request("b", PROMPT[:8] + [50, 51])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit_tokens) == (([1, 2],), 8)
    assert manager.allocate_slots(b, 2, 8, hits).get_block_ids() == ([4],)
    assert manager.get_num_common_prefix_blocks("a", num_running_requests=2) == (2,)
    manager.free(a)
    assert free_ids(manager) == [5, 6, 7, 8, 9, 10, 3]
    manager.free(b)
    assert free_ids(manager) == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    # The freed cached blocks still hit; the partial third block was never cached.
    assert schedule_prompt(manager, make_request("c", PROMPT)) == ([5],)
    assert manager.get_block_ids("c") == ([1, 2, 5],)


def test_mla_goes_first_beside_a_sliding_window():
    manager = KVCacheManager(4, num_gpu_blocks=31, max_model_len=64, kv_cache_groups=[WINDOW, MLA])
    coordinator = manager.coordinator
    assert isinstance(coordinator, HybridKVCacheCoordinator)
    assert [(type(m), ids) for m, ids in coordinator.attention_groups] == [
        (FullAttentionManager, (1,)),
        (SlidingWindowManager, (0,)),
    ]
    assert manager._full_attention_manager is None
    prompt = list(range(20))
    assert schedule_prompt(manager, make_request("a", prompt)) == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    hits, num_hit_tokens = manager.get_computed_blocks(make_request("b", prompt + [7]))
    # MLA uses the whole prefix, the window (group 0) only the blocks of its last 7 tokens.
    assert (hits.get_block_ids(), num_hit_tokens) == (([0, 0, 0, 4, 5], [6, 7, 8, 9, 10]), 20)
