"""ReferenceBackend against a dense per-request numpy attention, on hand-built paged batches.

Every batch has the same padded shapes (T tokens, R rows, a block table of W pages) so one
compiled step serves all scenarios of a (block size, GQA, masking) variant.
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.quick_compile import quick_jit
from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import ReferenceBackend

NUM_TOKENS = 256  # T
NUM_ROWS = 4  # R
MAX_MODEL_LEN = 512
HEAD_DIM = 32  # H
NUM_KV_HEADS = 2  # K
SM_SCALE = HEAD_DIM**-0.5

# Each request is (cached tokens, new tokens this step); missing rows are padding rows.
SCENARIOS = {
    "decode_only": [(5, 1), (130, 1), (17, 1), (300, 1)],
    "long_prefill": [(0, 250)],
    "mixed_chunked_prefill": [(40, 1), (100, 60), (0, 30), (260, 1)],
    "padding_rows": [(3, 4), (0, 9)],
}


@dataclasses.dataclass(frozen=True)
class Batch:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kv_cache: np.ndarray
    md: AttentionMetadata
    requests: list[tuple[int, int]]
    block_ids: list[list[int]]
    block_size: int


@functools.partial(quick_jit, static_argnames=("sliding_window", "soft_cap"), donate_argnames="kv_cache")
def _forward(q, k, v, kv_cache, md, sliding_window, soft_cap):
    return ReferenceBackend().forward(
        q, k, v, kv_cache, md, sm_scale=SM_SCALE, sliding_window=sliding_window, soft_cap=soft_cap
    )


def make_batch(requests, block_size: int, num_heads: int, seed: int = 0) -> Batch:
    """Random q/k/v and cache; each request gets shuffled, non-contiguous blocks (never block 0)."""
    rng = np.random.default_rng(seed)
    width = MAX_MODEL_LEN // block_size
    num_blocks = NUM_ROWS * width + 1
    free_blocks = list(rng.permutation(np.arange(1, num_blocks)))
    kv_cache = rng.standard_normal((2, num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM), np.float32)
    query_start_loc = np.zeros(NUM_ROWS + 1, np.int32)
    seq_lens = np.zeros(NUM_ROWS, np.int32)
    block_tables = np.zeros((NUM_ROWS, width), np.int32)
    slot_mapping = np.zeros(NUM_TOKENS, np.int32)  # padding tokens -> scratch block 0
    block_ids = []
    start = 0
    for row, (num_cached, num_new) in enumerate(requests):
        seq_len = num_cached + num_new
        ids = [int(free_blocks.pop()) for _ in range(-(-seq_len // block_size))]
        block_ids.append(ids)
        block_tables[row, : len(ids)] = ids
        positions = np.arange(num_cached, seq_len)
        slot_mapping[start : start + num_new] = (
            np.asarray(ids)[positions // block_size] * block_size + positions % block_size
        )
        seq_lens[row] = seq_len
        start += num_new
        query_start_loc[row + 1] = start
    query_start_loc[len(requests) + 1 :] = start
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(slot_mapping),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(block_tables),
        num_seqs=jnp.asarray([len(requests)], np.int32),
    )
    return Batch(
        q=rng.standard_normal((NUM_TOKENS, num_heads, HEAD_DIM), np.float32),
        k=rng.standard_normal((NUM_TOKENS, NUM_KV_HEADS, HEAD_DIM), np.float32),
        v=rng.standard_normal((NUM_TOKENS, NUM_KV_HEADS, HEAD_DIM), np.float32),
        kv_cache=kv_cache,
        md=md,
        requests=requests,
        block_ids=block_ids,
        block_size=block_size,
    )


def request_kv(batch: Batch, row: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense [seq_len, K, H] keys and values of one request: cached prefix + this step's rows."""
    num_cached, num_new = batch.requests[row]
    positions = np.arange(num_cached)
    blocks = np.asarray(batch.block_ids[row], np.int64)
    pages, offsets = blocks[positions // batch.block_size], positions % batch.block_size
    cached_k, cached_v = batch.kv_cache[0, pages, offsets], batch.kv_cache[1, pages, offsets]
    keys = np.concatenate([cached_k, batch.k[start : start + num_new]])
    values = np.concatenate([cached_v, batch.v[start : start + num_new]])
    return keys, values


def dense_attention(batch: Batch, sliding_window=None, soft_cap=None) -> np.ndarray:
    """Naive attention per request and query token, in float64; padding tokens stay 0."""
    num_heads = batch.q.shape[1]
    group = num_heads // NUM_KV_HEADS
    out = np.zeros(batch.q.shape, np.float64)
    start = 0
    for row, (num_cached, num_new) in enumerate(batch.requests):
        keys, values = request_kv(batch, row, start)
        for i in range(num_new):
            query_pos = num_cached + i
            visible = np.arange(query_pos + 1)
            if sliding_window is not None:
                visible = visible[visible > query_pos - sliding_window]
            for n in range(num_heads):
                scores = keys[visible, n // group] @ batch.q[start + i, n] * SM_SCALE
                if soft_cap is not None:
                    scores = soft_cap * np.tanh(scores / soft_cap)
                weights = np.exp(scores - scores.max())
                out[start + i, n] = weights @ values[visible, n // group] / weights.sum()
        start += num_new
    return out


def run(batch: Batch, sliding_window=None, soft_cap=None):
    out, kv_cache = _forward(
        jnp.asarray(batch.q),
        jnp.asarray(batch.k),
        jnp.asarray(batch.v),
        jnp.asarray(batch.kv_cache),
        batch.md,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
    )
    return np.asarray(out), np.asarray(kv_cache)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
def test_matches_dense_attention(scenario, group, block_size):
    batch = make_batch(SCENARIOS[scenario], block_size, NUM_KV_HEADS * group)
    out, _ = run(batch)
    np.testing.assert_allclose(out, dense_attention(batch), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16])
def test_sliding_window(block_size):
    batch = make_batch(SCENARIOS["mixed_chunked_prefill"], block_size, 2 * NUM_KV_HEADS, seed=1)
    out, _ = run(batch, sliding_window=37)
    np.testing.assert_allclose(out, dense_attention(batch, sliding_window=37), atol=2e-5, rtol=1e-5)


def test_soft_cap():
    batch = make_batch(SCENARIOS["mixed_chunked_prefill"], 16, 2 * NUM_KV_HEADS, seed=2)
    batch = dataclasses.replace(batch, q=batch.q * 8.0)  # scores large enough for the cap to bite
    out, _ = run(batch, soft_cap=5.0)
    np.testing.assert_allclose(out, dense_attention(batch, soft_cap=5.0), atol=2e-5, rtol=1e-5)
    assert not np.allclose(out, dense_attention(batch), atol=1e-3)


def test_padding_tokens_give_zero_and_no_nan():
    batch = make_batch(SCENARIOS["padding_rows"], 16, NUM_KV_HEADS)
    out, _ = run(batch)
    num_real = sum(num_new for _, num_new in batch.requests)
    assert np.isfinite(out).all()
    assert np.all(out[num_real:] == 0.0)


@pytest.mark.parametrize("block_size", [4, 16])
def test_cache_holds_new_rows_and_nothing_else_changes(block_size):
    batch = make_batch(SCENARIOS["mixed_chunked_prefill"], block_size, NUM_KV_HEADS)
    _, kv_cache = run(batch)
    expected = batch.kv_cache.copy()
    start = 0
    for row, (num_cached, num_new) in enumerate(batch.requests):
        for i, pos in enumerate(range(num_cached, num_cached + num_new)):
            block = batch.block_ids[row][pos // block_size]
            expected[:, block, pos % block_size] = [batch.k[start + i], batch.v[start + i]]
        start += num_new
    # Block 0 is the scratch block padding tokens write to: its contents are unspecified.
    np.testing.assert_array_equal(kv_cache[:, 1:], expected[:, 1:])


def test_jit_donates_the_cache():
    batch = make_batch(SCENARIOS["decode_only"], 16, NUM_KV_HEADS)
    kv_cache = jnp.asarray(batch.kv_cache)
    _forward(
        jnp.asarray(batch.q),
        jnp.asarray(batch.k),
        jnp.asarray(batch.v),
        kv_cache,
        batch.md,
        sliding_window=None,
        soft_cap=None,
    )
    assert kv_cache.is_deleted()


def test_kv_cache_shape():
    assert ReferenceBackend().kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert ReferenceBackend.name == "reference"


def test_small_chunks_match_one_big_chunk():
    batch = make_batch(SCENARIOS["mixed_chunked_prefill"], 4, 2 * NUM_KV_HEADS, seed=3)
    backend = ReferenceBackend(keys_per_chunk=8)
    small = quick_jit(functools.partial(backend.forward, sm_scale=SM_SCALE))
    out, _ = small(
        jnp.asarray(batch.q),
        jnp.asarray(batch.k),
        jnp.asarray(batch.v),
        jnp.asarray(batch.kv_cache),
        batch.md,
    )
    np.testing.assert_allclose(np.asarray(out), dense_attention(batch), atol=2e-5, rtol=1e-5)
