"""The launch structure of the ragged paged attention kernel: two launches per call, the
split-KV policy, rows of one segment written by the decode launch, and the edge steps of the
fused merge + prefill launch (a full bucket with no padding, a decode-only step, an empty key
segment), in interpret mode against the float64 oracle.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from vjx.kernels import kv_walk
from vjx.kernels import ragged_paged_attention as rpa
from vjx.kernels.tuning import AttentionTuning, KernelTuning

TUNING = AttentionTuning(
    decode=KernelTuning(block_k=16),
    prefill=KernelTuning(block_m=32, block_k=16),
    decode_programs=8,
    max_kv_splits=4,
)
SCORING = rpa.Scoring(sm_scale=0.125)


# One shape for the end-to-end cases, so they share a compiled call per tuning.
SHAPE = BatchShape(16, 4, 8, 2, 64, 16, 256)


@functools.partial(jax.jit, static_argnames=("tuning",))
def _attend(q, kv_cache, md, tuning):
    return rpa.ragged_paged_attention(
        q,
        kv_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_tables,
        md.num_seqs,
        scoring=SCORING,
        tuning=tuning,
        interpret=True,
    )


def _run(batch, tuning: AttentionTuning = TUNING) -> np.ndarray:
    q, _, _, kv_cache = batch.device_arrays()
    return np.asarray(_attend(q, kv_cache, batch.md, tuning), np.float32)


def _check(batch, tuning: AttentionTuning = TUNING) -> None:
    out = _run(batch, tuning)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, SCORING.sm_scale)
    assert relative_error(out[:num_real], expected[:num_real]) < 1e-5
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"


def test_a_call_is_two_launches_and_nothing_else():
    """No zero fill or split-count fusion either: the decode launch, then merge + prefill."""
    batch = make_batch([(20, 1), (0, 5)], SHAPE)
    q, _, _, kv_cache = batch.device_arrays()
    md = batch.md
    jaxpr = jax.make_jaxpr(functools.partial(rpa.ragged_paged_attention, scoring=SCORING, interpret=True))(
        q, kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs
    )
    [call] = jaxpr.eqns
    launches = [(eqn.primitive.name, eqn.params.get("name")) for eqn in call.params["jaxpr"].eqns]
    assert launches == [("pallas_call", "decode_kernel"), ("pallas_call", "merge_prefill_kernel")]


@pytest.mark.parametrize(
    ("num_seqs", "seq_len", "window", "expected"),
    [
        (1, 2048, None, 16),  # one long row: max_kv_splits segments
        (8, 2048, None, 8),  # decode_programs // num_seqs
        (64, 2048, None, 1),  # many rows: one program each
        (1, 128, None, 1),  # two 64-key tiles: too short to split
        (1, 129, None, 2),  # three tiles: segments of 2 and 1
        (8, 0, None, 1),
        (1, 4096, 256, 2),  # only the window's 4 tiles count
        (1, 4097, 256, 3),  # the window starts inside a tile: 5 tiles
    ],
)
def test_split_policy(num_seqs, seq_len, window, expected):
    splits = rpa.Splits(decode_programs=64, max_kv_splits=16, min_tiles_per_split=2, block_k=64, sliding_window=window)
    max_splits = splits.max_splits(jnp.int32(num_seqs))
    assert int(splits.row_splits(jnp.int32(seq_len), max_splits)) == expected


def test_decode_launch_writes_rows_of_one_segment():
    """After the decode launch alone, the unsplit rows hold their final output; the split row
    and the padding tokens are left to the merge + prefill launch (NaN in interpret mode)."""
    batch = make_batch([(240, 1), (3, 1), (20, 1)], SHAPE)
    q, _, _, kv_cache = batch.device_arrays()
    md = batch.md
    scales = jnp.ones((2,), jnp.float32)
    step = rpa._Step(
        q, kv_cache, scales, None, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs, SCORING, True
    )
    geometry = kv_walk.Geometry(2, 4, 64, 16, block_m=16, block_k=16)
    splits = rpa.Splits(8, 4, 2, 16, None)  # 2 segments at most for 3 rows
    *_, out = rpa._decode(step, geometry, splits, TUNING.decode, None)
    out = np.asarray(out)
    expected = dense_attention(batch, SCORING.sm_scale)
    assert np.all(np.isnan(out[0])), "241 keys, 16 tiles: two segments, merged later"
    assert relative_error(out[1:3], expected[1:3]) < 1e-5
    assert np.all(np.isnan(out[3:]))


def test_full_bucket_without_padding():
    """num_seqs == R and every token real: no padding row; a split decode row is merged in the
    same launch as two prefill rows' blocks."""
    _check(make_batch([(100, 1), (3, 1), (40, 7), (0, 7)], SHAPE))


def test_decode_only_step():
    """num_seqs == R decode rows, two of them split: the merge + prefill launch runs their
    merges and zeroes the padding tokens, and has no prefill block."""
    _check(make_batch([(100, 1), (3, 1), (60, 1), (0, 1)], SHAPE))


def test_empty_segment():
    """With one tile per segment allowed, 71 keys (5 tiles) take 4 segments of 2, 2, 1 and 0
    tiles; the empty one folds in as nothing."""
    tuning = AttentionTuning(
        decode=TUNING.decode,
        prefill=TUNING.prefill,
        decode_programs=8,
        max_kv_splits=4,
        min_tiles_per_split=1,
    )
    _check(make_batch([(240, 1), (70, 1), (30, 12)], SHAPE), tuning)


def test_many_short_prefill_rows():
    """Rows of 3 tokens in 2-token query blocks (8 query heads on one kv head): 11 blocks of
    the 12 the grid bound allows."""
    requests = [(3, 3), (0, 3), (5, 3), (9, 3), (1, 3)]
    tuning = AttentionTuning(decode=TUNING.decode, prefill=KernelTuning(block_m=16, block_k=16))
    _check(make_batch(requests, BatchShape(16, 8, 8, 1, 64, 16, 64)), tuning)
