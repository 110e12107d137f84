"""The Triton-compiled kernels on the GPU at real sizes (run with `pytest -m gpu` on the device).

The same ragged, NaN-poisoned batches and float64 oracle as the interpret-mode tests, with
the shipped knobs and rows of thousands of keys (so decode rows split, prefill rows span many
query blocks, and unmasked and masked tiles both run), and decode steps in the runner's
buckets (256 rows, 16 tokens).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from vjx.kernels.ragged_paged_attention import Scoring, ragged_paged_attention

pytestmark = pytest.mark.gpu

ROWS = [(4000, 1), (2500, 1), (4400, 1), (1000, 300), (0, 700), (33, 200)]
# (name, dtype, query heads, kv heads, head dim, tolerance)
CONFIGS = [
    ("bf16_gqa4_d128", jnp.bfloat16, 32, 8, 128, 2e-2),
    ("f32_gqa4_d128", jnp.float32, 32, 8, 128, 1e-5),
    ("bf16_mha_d64", jnp.bfloat16, 8, 8, 64, 2e-2),
    ("bf16_gqa8_d256", jnp.bfloat16, 32, 4, 256, 2e-2),
]


@functools.partial(jax.jit, static_argnames=("scoring",))
def _attend(q, kv_cache, md, scoring):
    return ragged_paged_attention(
        q, kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs, scoring=scoring
    )


def _check(batch, scoring: Scoring, tolerance: float) -> None:
    q, _, _, kv_cache = batch.device_arrays()
    out = np.asarray(_attend(q, kv_cache, batch.md, scoring), np.float32)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, scoring.sm_scale, scoring.sliding_window, scoring.soft_cap)
    assert relative_error(out[:num_real], expected[:num_real]) < tolerance
    assert np.all(out[num_real:] == 0.0)


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_real_size_ragged_batch(config):
    _, dtype, num_heads, num_kv_heads, head_dim, tolerance = config
    shape = BatchShape(1280, 8, num_heads, num_kv_heads, head_dim, 16, 4608)
    batch = make_batch(ROWS, shape, dtype)
    _check(batch, Scoring(head_dim**-0.5), tolerance)


def test_real_size_sliding_window_and_soft_cap():
    shape = BatchShape(1280, 8, 32, 8, 128, 16, 4608)
    batch = make_batch(ROWS, shape, jnp.bfloat16, seed=1)
    _check(batch, Scoring(128**-0.5, sliding_window=1000, soft_cap=30.0), 2e-2)


def test_long_decode_splits():
    """Four rows of 32k keys: 16 segments each under the shipped split target."""
    shape = BatchShape(16, 4, 32, 8, 128, 16, 32768)
    batch = make_batch([(32767, 1), (20000, 1), (31000, 1), (5, 1)], shape, jnp.bfloat16)
    _check(batch, Scoring(128**-0.5), 2e-2)


@pytest.mark.parametrize(
    ("requests", "shape"),
    [
        # Batch 8 in the 16-token bucket of 256 rows: unsplit rows written by the decode launch.
        ([(120, 1)] * 8, BatchShape(16, 256, 32, 8, 128, 16, 256)),
        # One row split 16 ways beside short decodes and a prefill chunk, in one step.
        ([(2047, 1), (5, 1), (200, 1), (300, 20)], BatchShape(32, 16, 32, 8, 128, 16, 2048)),
        # Batch 64 at 2k keys in the 64-token bucket: one segment per row.
        ([(2047, 1)] * 64, BatchShape(64, 64, 32, 8, 128, 16, 2048)),
    ],
    ids=["b8_short_r256", "split_mixed", "b64_2k"],
)
def test_decode_step_buckets(requests, shape):
    _check(make_batch(requests, shape, jnp.bfloat16), Scoring(128**-0.5), 2e-2)
