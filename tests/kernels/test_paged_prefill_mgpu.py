"""The Mosaic GPU prefill kernel against a float64 oracle: in Mosaic GPU's CPU interpreter at
tiny sizes, and at real sizes on a Hopper GPU (`pytest -m gpu`).

The kernel runs inside `ragged_paged_attention`, whose Triton launches write the decode rows
and padding tokens into its output. The interpreter starts every buffer as NaN, so a token
that no launch writes fails the comparison. Keys past a row's length must be finite for this
kernel (the engine's cache is zero-initialized), so the oracle's NaN poison outside the rows'
keys is replaced by random values here.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from tests.helpers.quick_compile import quick_jit
from vjx.attention.backend import get_attention_backend
from vjx.attention.pallas_gpu import PallasGpuBackend
from vjx.kernels.paged_prefill_mgpu import MosaicPrefillTuning, num_query_blocks, query_block_schedule
from vjx.kernels.ragged_paged_attention import Scoring, ragged_paged_attention, uses_mosaic_prefill
from vjx.kernels.tuning import AttentionTuning, KernelTuning

# Decode rows, chunked prefill on a context, a row of several query blocks and padding.
REQUESTS = [(40, 1), (100, 60), (0, 130), (190, 1), (7, 9)]
TUNING = AttentionTuning(decode=KernelTuning(block_k=16), prefill=KernelTuning(block_m=32, block_k=16))


def _finite_batch(requests, shape: BatchShape, dtype, seed: int = 0):
    batch = make_batch(requests, shape, dtype, seed=seed)
    rng = np.random.default_rng(seed + 1)
    noise = np.asarray(jnp.asarray(rng.standard_normal(batch.kv_cache.shape), dtype), np.float32)
    return dataclasses.replace(batch, kv_cache=np.where(np.isnan(batch.kv_cache), noise, batch.kv_cache))


@functools.partial(quick_jit, static_argnames=("scoring", "tuning", "mosaic", "interpret"))
def _attend(q, kv_cache, md, scoring, tuning, mosaic, interpret):
    metadata = (md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs)
    return ragged_paged_attention(
        q, kv_cache, *metadata, scoring=scoring, tuning=tuning, mosaic_prefill=mosaic, interpret=interpret
    )


def _check(batch, mosaic: MosaicPrefillTuning, tuning=None, interpret: bool = False, tolerance: float = 2e-2):
    q, _, _, kv_cache = batch.device_arrays()
    scoring = Scoring(sm_scale=batch.shape.head_dim**-0.5)
    assert uses_mosaic_prefill(q, kv_cache, scoring, None, mosaic)
    out = np.asarray(_attend(q, kv_cache, batch.md, scoring, tuning, mosaic, interpret), np.float32)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, scoring.sm_scale)
    assert relative_error(out[:num_real], expected[:num_real]) < tolerance
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"


def test_interpreted_kernel_matches_dense_attention():
    """Pages of a quarter tile (four copies a tile); pages larger than a tile (one slice a
    tile) run in the GPU test, as the interpreter takes about two seconds a program."""
    shape = BatchShape(256, 6, 2, 1, 64, 16, 256)
    batch = _finite_batch(REQUESTS, shape, jnp.bfloat16)
    _check(batch, MosaicPrefillTuning(block_q=64, block_kv=64), TUNING, interpret=True)


def test_schedule_covers_every_prefill_token_once_last_blocks_first():
    q_lens = np.asarray([1, 300, 2, 1, 129, 128, 17, 1], np.int32)
    num_seqs, block_tokens, num_tokens = 7, 128, 1024  # the last row is a padding row
    query_start_loc = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    query_start_loc[num_seqs + 1 :] = query_start_loc[num_seqs]
    num_blocks = num_query_blocks(num_tokens, len(q_lens), block_tokens)
    schedule = np.asarray(
        query_block_schedule(jnp.asarray(query_start_loc), jnp.asarray([num_seqs]), num_blocks, block_tokens)
    )
    covered = np.zeros(num_tokens, np.int32)
    seen_rows = []
    for row, first in schedule:
        if row < 0:
            continue
        start, end = query_start_loc[row], query_start_loc[row + 1]
        assert first % 8 == 0 and start - 8 < first < end  # TMA reads whole 8-row tiles
        covered[max(first, start) : min(first + block_tokens, end)] += 1
        if row not in seen_rows:  # a row's first block in the schedule is its last
            assert end - first <= block_tokens
            seen_rows.append(row)
    prefill = np.zeros(num_tokens, np.int32)
    for row in range(num_seqs):
        if q_lens[row] > 1:
            prefill[query_start_loc[row] : query_start_loc[row + 1]] = 1
    np.testing.assert_array_equal(covered, prefill)
    assert seen_rows == [1, 2, 4, 5, 6]


def test_the_mosaic_kernel_takes_plain_16_bit_steps_of_a_query_block_or_more():
    tuning = MosaicPrefillTuning()
    q = jnp.zeros((256, 8, 128), jnp.bfloat16)
    cache = jnp.zeros((2, 2, 4, 16, 128), jnp.bfloat16)
    plain = Scoring(0.1)
    assert uses_mosaic_prefill(q, cache, plain, None, tuning)
    assert not uses_mosaic_prefill(q[:64], cache, plain, None, tuning)
    assert not uses_mosaic_prefill(q[:252], cache, plain, None, tuning)  # not a multiple of 8
    assert not uses_mosaic_prefill(q, cache.astype(jnp.float8_e4m3fn), plain, None, tuning)
    assert not uses_mosaic_prefill(q.astype(jnp.float32), cache.astype(jnp.float32), plain, None, tuning)
    assert not uses_mosaic_prefill(
        jnp.zeros((256, 8, 256), jnp.bfloat16), jnp.zeros((2, 2, 4, 16, 256)), plain, None, tuning
    )
    assert not uses_mosaic_prefill(q, cache, Scoring(0.1, sliding_window=64), None, tuning)
    assert not uses_mosaic_prefill(q, cache, Scoring(0.1, soft_cap=30.0), None, tuning)
    assert not uses_mosaic_prefill(q, cache, plain, jnp.zeros((8,)), tuning)


def test_backend_picks_the_prefill_kernel():
    assert PallasGpuBackend().mosaic_prefill() is None  # "triton" by default
    assert PallasGpuBackend(prefill_kernel="mosaic", interpret=True).mosaic_prefill() == MosaicPrefillTuning()
    if jax.default_backend() != "gpu":
        assert PallasGpuBackend(prefill_kernel="mosaic").mosaic_prefill() is None  # no Hopper GPU
    assert get_attention_backend("pallas_gpu_mosaic").prefill_kernel == "mosaic"
    with pytest.raises(ValueError, match="prefill_kernel"):
        PallasGpuBackend(prefill_kernel="cudnn")
    with pytest.raises(ValueError, match="block_kv"):
        MosaicPrefillTuning(block_kv=96)
    with pytest.raises(ValueError, match="stages"):
        MosaicPrefillTuning(stages=1)


# Rows of thousands of keys at real head counts: many query blocks, unmasked and masked tiles.
GPU_ROWS = [(4000, 1), (2500, 1), (1000, 300), (0, 700), (33, 200), (0, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, page_size", [(32, 8, 128, 16), (8, 8, 64, 16), (32, 8, 128, 256)]
)
def test_kernel_on_the_gpu_matches_dense_attention(num_heads, num_kv_heads, head_dim, page_size):
    num_tokens = -(-sum(n for _, n in GPU_ROWS) // 16) * 16 + 16
    shape = BatchShape(num_tokens, 8, num_heads, num_kv_heads, head_dim, page_size, 4608)
    _check(_finite_batch(GPU_ROWS, shape, jnp.bfloat16), MosaicPrefillTuning())
