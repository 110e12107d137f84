"""The scheduler runs the KV cache groups the worker gives it: under a sliding window a long
request keeps only the blocks its window needs, while full attention must hold them all."""

import pytest

from tests.helpers.scheduler import BLOCK_SIZE, make_request, make_scheduler, num_free_blocks, step
from vjx.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

HEADS = dict(num_kv_heads=1, head_size=8, dtype="float32")
WINDOW = SlidingWindowSpec(BLOCK_SIZE, **HEADS, sliding_window=8)


def test_a_sliding_window_request_runs_past_the_pool_and_frees_blocks_behind_its_window():
    # 6 usable blocks of 4 tokens hold 24 tokens; the request grows to 64.
    scheduler = make_scheduler(num_gpu_blocks=7, max_model_len=64, max_num_batched_tokens=8, kv_cache_spec=WINDOW)
    scheduler.add_request(make_request("a", list(range(6)), max_tokens=58, ignore_eos=True))
    num_generated = 0
    while scheduler.has_unfinished_requests():
        out, _ = step(scheduler, {"a": [7]})
        num_generated += bool(out.num_scheduled_tokens)
        blocks = scheduler.kv_cache_manager.get_blocks("a").blocks[0] if scheduler.running else []
        held = [block.block_id for block in blocks if not block.is_null]
        # The next token sees 7 earlier ones: at most 3 blocks of 4 (2 + the partial one).
        assert len(held) <= 3
    assert num_generated == 58
    assert num_free_blocks(scheduler) == 6


def test_full_attention_with_the_same_pool_is_refused():
    with pytest.raises(ValueError, match="num_gpu_blocks=7 holds 24 tokens .* max_model_len=64"):
        make_scheduler(
            num_gpu_blocks=7,
            max_model_len=64,
            max_num_batched_tokens=8,
            kv_cache_spec=FullAttentionSpec(BLOCK_SIZE, **HEADS),
        )


def test_the_window_bounds_what_one_request_may_hold():
    assert WINDOW.max_num_blocks_per_request(max_model_len=64, max_num_batched_tokens=8) == 5
    assert WINDOW.max_num_blocks_per_request(max_model_len=6, max_num_batched_tokens=8) == 3
    assert FullAttentionSpec(BLOCK_SIZE, **HEADS).max_num_blocks_per_request(64, 8) == 16
    assert WINDOW.page_size_bytes == 2 * BLOCK_SIZE * 1 * 8 * 4
