"""The Pallas ragged paged attention kernel in interpret mode against a float64 oracle.

Every scenario of a variant has the same padded shapes, so one compiled call serves them all.
Small tiles and a small split target make short rows walk several tiles and split their keys,
as long rows do on a GPU with the default knobs. Outputs start as NaN in interpret mode, so
a token that no launch writes (a padding token included) fails the comparison.
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from tests.helpers.quick_compile import quick_jit
from vjx.kernels.ragged_paged_attention import Scoring, ragged_paged_attention
from vjx.kernels.tuning import AttentionTuning, KernelTuning, default_tuning

NUM_TOKENS = 128
NUM_ROWS = 6
MAX_MODEL_LEN = 256
TUNING = AttentionTuning(
    decode=KernelTuning(block_k=16),
    prefill=KernelTuning(block_m=32, block_k=16),
    decode_programs=8,
    max_kv_splits=4,
)

# Each request is (cached tokens, new tokens); missing rows are padding rows.
SCENARIOS = {
    "decode_only": [(5, 1), (130, 1), (16, 1), (200, 1), (63, 1), (0, 1)],
    "two_long_decodes": [(240, 1), (3, 1)],  # 4 segments and 1 (written by the decode launch)
    # Split and unsplit decode rows with prefill rows: merges and prefill blocks in one launch.
    "mixed_split_decodes": [(230, 1), (3, 1), (90, 25), (0, 2)],
    "prefill_only": [(0, 100), (0, 17)],
    "mixed_chunked_prefill": [(40, 1), (100, 60), (0, 30), (190, 1), (7, 9)],
    "padding_rows": [(3, 4), (0, 9)],
}
# (dtype, query heads per kv head, head dim, page size): every GQA ratio and head dim of the
# issue, page sizes below, at and above the 16-key tile.
VARIANTS = {
    "f32_mha_d64_s16": (jnp.float32, 1, 64, 16),
    "f32_gqa4_d128_s8": (jnp.float32, 4, 128, 8),
    "bf16_gqa8_d64_s32": (jnp.bfloat16, 8, 64, 32),
    "bf16_gqa2_d256_s16": (jnp.bfloat16, 2, 256, 16),
}
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def _shape(group: int, head_dim: int, page_size: int) -> BatchShape:
    return BatchShape(NUM_TOKENS, NUM_ROWS, 2 * group, 2, head_dim, page_size, MAX_MODEL_LEN)


@functools.partial(quick_jit, static_argnames=("scoring",))
def _attend(q, kv_cache, md, scoring):
    return ragged_paged_attention(
        q,
        kv_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_tables,
        md.num_seqs,
        scoring=scoring,
        tuning=TUNING,
        interpret=True,
    )


def _run(batch, scoring: Scoring) -> np.ndarray:
    q, _, _, kv_cache = batch.device_arrays()
    return np.asarray(_attend(q, kv_cache, batch.md, scoring), np.float32)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_dense_attention(variant, scenario):
    dtype, group, head_dim, page_size = VARIANTS[variant]
    batch = make_batch(SCENARIOS[scenario], _shape(group, head_dim, page_size), dtype)
    scoring = Scoring(sm_scale=head_dim**-0.5)
    out = _run(batch, scoring)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, scoring.sm_scale)
    assert relative_error(out[:num_real], expected[:num_real]) < TOLERANCE[dtype]
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"


@pytest.mark.parametrize("scenario", ["two_long_decodes", "mixed_chunked_prefill", "mixed_split_decodes"])
def test_sliding_window_and_soft_cap(scenario):
    batch = make_batch(SCENARIOS[scenario], _shape(4, 64, 16), seed=1)
    batch = dataclasses.replace(batch, q=batch.q * 4.0)  # logits large enough for the cap to bite
    for window, cap in [(37, None), (16, 5.0)]:
        scoring = Scoring(sm_scale=0.125, sliding_window=window, soft_cap=cap)
        out = _run(batch, scoring)
        expected = dense_attention(batch, 0.125, sliding_window=window, soft_cap=cap)
        num_real = batch.real_tokens()
        assert relative_error(out[:num_real], expected[:num_real]) < 1e-5, (window, cap)
        assert relative_error(out[:num_real], dense_attention(batch, 0.125)[:num_real]) > 1e-2


def test_default_tuning_runs_long_rows():
    """The shipped knobs (64-key tiles, 64 decode programs) on rows of several tiles."""
    batch = make_batch([(300, 1), (0, 90), (150, 40)], BatchShape(256, 4, 8, 2, 64, 16, 512))
    q, _, _, kv_cache = batch.device_arrays()
    scoring = Scoring(sm_scale=0.125)
    md = batch.md
    out = quick_jit(functools.partial(ragged_paged_attention, scoring=scoring, interpret=True))(
        q, kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs
    )
    expected = dense_attention(batch, 0.125)
    assert relative_error(np.asarray(out)[:131], expected[:131]) < 1e-5


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "argument"),
    [(4, 2, 96, "head_dim"), (6, 4, 64, "num_kv_heads")],
)
def test_bad_shapes_raise(num_heads, num_kv_heads, head_dim, argument):
    q = jnp.zeros((16, num_heads, head_dim), jnp.float32)
    kv_cache = jnp.zeros((2, num_kv_heads, 8, 16, head_dim), jnp.float32)
    metadata = (
        jnp.zeros((3,), jnp.int32),
        jnp.zeros((2,), jnp.int32),
        jnp.zeros((2, 4), jnp.int32),
        jnp.ones((1,), jnp.int32),
    )
    with pytest.raises(ValueError, match=argument):
        ragged_paged_attention(q, kv_cache, *metadata, scoring=Scoring(1.0), interpret=True)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"sm_scale": 1.0, "sliding_window": 0}, "sliding_window"),
        ({"sm_scale": 1.0, "soft_cap": -1.0}, "soft_cap"),
    ],
)
def test_bad_scoring_raises(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        Scoring(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"block_m": 48}, "block_m"),
        ({"block_k": 8}, "block_k"),
        ({"num_warps": 3}, "num_warps"),
        ({"num_stages": 0}, "num_stages"),
    ],
)
def test_bad_kernel_tuning_raises(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        KernelTuning(**kwargs)


def test_bad_attention_tuning_raises():
    with pytest.raises(ValueError, match="decode_programs"):
        AttentionTuning(decode_programs=0)
    with pytest.raises(ValueError, match="max_kv_splits"):
        AttentionTuning(max_kv_splits=0)
    with pytest.raises(ValueError, match="min_tiles_per_split"):
        AttentionTuning(min_tiles_per_split=0)


def test_default_tuning_by_head_dim_and_dtype():
    assert default_tuning(128, jnp.bfloat16).prefill.block_m == 128
    assert default_tuning(128, jnp.float32).prefill.block_m == 64
    assert default_tuning(256, jnp.bfloat16).decode.block_k == 32
    assert default_tuning(32, jnp.float32) == default_tuning(64, jnp.float32)
