"""Paged MLA attention (vjx/attention/mla.py), absorbed and expanded, against a dense float64
numpy oracle of the expanded form (per-head keys [c_kv W_UK, k_pe], values c_kv W_UV).

One ragged step: a decode row whose keys span two softmax chunks, a prefill chunk continuing
a cached prefix, a fresh prompt, then a padding row and padding tokens; and a pure-decode step.
Pages are drawn in random order (never block 0, the scratch block); the slots no row owns hold
stale random latents that attention must not read.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.mla import (
    UpProjection,
    absorbed_attention,
    expanded_attention,
    mla_attention,
    mla_kv_cache_shape,
    write_latent,
)

NUM_TOKENS = 64  # T
NUM_ROWS = 4  # R
NUM_HEADS = 4  # N
KV_LORA_RANK = 32  # R
ROPE_DIM = 16  # E
NOPE_DIM = 24  # P
VALUE_DIM = 20  # V
LATENT_DIM = KV_LORA_RANK + ROPE_DIM  # Lk
BLOCK_SIZE = 16  # S
MAX_MODEL_LEN = 256
SM_SCALE = 0.125
# (cached tokens, new tokens): decode over 151 keys (two chunks of 128), a chunked prefill,
# a fresh prompt; row 3 is padding.
REQUESTS = [(150, 1), (40, 25), (0, 30)]
DECODE_REQUESTS = [(150, 1), (40, 1), (0, 1)]


@dataclasses.dataclass(frozen=True)
class Batch:
    requests: list[tuple[int, int]]
    q: np.ndarray  # [T, N, P + E]
    latent: np.ndarray  # [T, Lk]: this step's latents
    w_uk: np.ndarray  # [R, N, P]
    w_uv: np.ndarray  # [R, N, V]
    kv_cache: np.ndarray  # [P, S, Lk] before the step
    md: AttentionMetadata
    block_ids: list[list[int]]
    slot_mapping: np.ndarray  # [T]


def make_batch(requests: list[tuple[int, int]], seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    width = MAX_MODEL_LEN // BLOCK_SIZE
    num_blocks = NUM_ROWS * width + 1
    free_blocks = list(rng.permutation(np.arange(1, num_blocks)))
    query_start_loc = np.zeros(NUM_ROWS + 1, np.int32)
    seq_lens = np.zeros(NUM_ROWS, np.int32)
    block_tables = np.zeros((NUM_ROWS, width), np.int32)
    slot_mapping = np.zeros(NUM_TOKENS, np.int32)  # padding tokens -> scratch block 0
    block_ids, start = [], 0
    for row, (num_cached, num_new) in enumerate(requests):
        seq_len = num_cached + num_new
        ids = [int(free_blocks.pop()) for _ in range(-(-seq_len // BLOCK_SIZE))]
        block_ids.append(ids)
        block_tables[row, : len(ids)] = ids
        positions = np.arange(num_cached, seq_len)
        slot_mapping[start : start + num_new] = np.asarray(ids)[positions // BLOCK_SIZE] * BLOCK_SIZE + (
            positions % BLOCK_SIZE
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
        requests=requests,
        q=rng.standard_normal((NUM_TOKENS, NUM_HEADS, NOPE_DIM + ROPE_DIM), np.float32),
        latent=rng.standard_normal((NUM_TOKENS, LATENT_DIM), np.float32),
        w_uk=rng.standard_normal((KV_LORA_RANK, NUM_HEADS, NOPE_DIM), np.float32) / np.sqrt(KV_LORA_RANK),
        w_uv=rng.standard_normal((KV_LORA_RANK, NUM_HEADS, VALUE_DIM), np.float32) / np.sqrt(KV_LORA_RANK),
        kv_cache=rng.standard_normal(mla_kv_cache_shape(num_blocks, BLOCK_SIZE, LATENT_DIM), np.float32),
        md=md,
        block_ids=block_ids,
        slot_mapping=slot_mapping,
    )


def dense_mla(batch: Batch) -> np.ndarray:
    """Expanded MLA per request and query token, in float64: per-head keys [c_kv W_UK, k_pe]
    and values c_kv W_UV over the row's cached and new latents; padding tokens stay 0."""
    flat = batch.kv_cache.reshape(-1, LATENT_DIM).astype(np.float64)
    w_uk, w_uv = batch.w_uk.astype(np.float64), batch.w_uv.astype(np.float64)
    out = np.zeros((NUM_TOKENS, NUM_HEADS, VALUE_DIM), np.float64)
    start = 0
    for row, (num_cached, num_new) in enumerate(batch.requests):
        positions = np.arange(num_cached)
        blocks = np.asarray(batch.block_ids[row])
        cached = flat[blocks[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE]
        latents = np.concatenate([cached, batch.latent[start : start + num_new]])
        c_kv, k_pe = latents[:, :KV_LORA_RANK], latents[:, KV_LORA_RANK:]
        keys = np.concatenate(
            [np.einsum("jr,rnp->njp", c_kv, w_uk), np.broadcast_to(k_pe, (NUM_HEADS, *k_pe.shape))], axis=-1
        )
        values = np.einsum("jr,rnv->njv", c_kv, w_uv)
        for i in range(num_new):
            seen = num_cached + i + 1
            q = batch.q[start + i].astype(np.float64)  # [N, P + E]
            scores = np.einsum("nh,njh->nj", q, keys[:, :seen]) * SM_SCALE
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[start + i] = np.einsum("nj,njv->nv", weights, values[:, :seen]) / weights.sum(axis=-1)[:, None]
        start += num_new
    return out


def up(batch: Batch) -> UpProjection:
    return UpProjection(jnp.asarray(batch.w_uk), jnp.asarray(batch.w_uv))


@functools.partial(jax.jit, donate_argnames="kv_cache")
def _mla(q, latent, kv_cache, md, up):
    return mla_attention(q, latent, kv_cache, md, up, sm_scale=SM_SCALE)


@functools.partial(jax.jit, static_argnames="form")
def _one_form(q, latent, kv_cache, md, up, form):
    kv_cache = write_latent(kv_cache, latent, md.slot_mapping)
    if form == "absorbed":
        return absorbed_attention(q, kv_cache, md, up, sm_scale=SM_SCALE)
    return expanded_attention(q, latent, kv_cache, md, up, sm_scale=SM_SCALE)


def run(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    out, kv_cache = _mla(
        jnp.asarray(batch.q), jnp.asarray(batch.latent), jnp.asarray(batch.kv_cache), batch.md, up(batch)
    )
    return np.asarray(out), np.asarray(kv_cache)


def assert_matches_dense(batch: Batch, out: np.ndarray) -> None:
    num_real = sum(num_new for _, num_new in batch.requests)
    expected = dense_mla(batch)
    assert out.shape == (NUM_TOKENS, NUM_HEADS, VALUE_DIM)
    error = np.abs(out[:num_real] - expected[:num_real]).max() / np.abs(expected[:num_real]).max()
    assert error < 1e-5
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"


@pytest.fixture(scope="module")
def batch() -> Batch:
    return make_batch(REQUESTS)


@pytest.fixture(scope="module")
def result(batch):
    return run(batch)


def test_cache_shape_has_one_latent_per_slot():
    assert mla_kv_cache_shape(10, BLOCK_SIZE, LATENT_DIM) == (10, 16, 48)


def test_a_mixed_step_matches_dense_mla(batch, result):
    assert_matches_dense(batch, result[0])


def test_a_decode_step_matches_dense_mla():
    batch = make_batch(DECODE_REQUESTS, seed=1)
    assert_matches_dense(batch, run(batch)[0])


@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_absorbed_and_expanded_forms_each_match_dense_mla(batch, form):
    """The two forms on the same ragged step: decode, chunked prefill and a fresh prompt."""
    args = (jnp.asarray(batch.q), jnp.asarray(batch.latent), jnp.asarray(batch.kv_cache), batch.md, up(batch))
    assert_matches_dense(batch, np.asarray(_one_form(*args, form)))


def test_cache_holds_the_written_latents_at_their_slots(batch, result):
    _, kv_cache = result
    num_real = sum(num_new for _, num_new in batch.requests)
    flat, before = kv_cache.reshape(-1, LATENT_DIM), batch.kv_cache.reshape(-1, LATENT_DIM)
    real_slots = batch.slot_mapping[:num_real]
    np.testing.assert_array_equal(flat[real_slots], batch.latent[:num_real])
    untouched = np.ones(len(flat), bool)
    untouched[real_slots] = False
    untouched[:BLOCK_SIZE] = False  # block 0 takes the padding tokens' latents
    np.testing.assert_array_equal(flat[untouched], before[untouched])


def test_rejects_a_query_that_does_not_fit_the_cache(batch):
    with pytest.raises(ValueError, match=r"q must be \[T, 4, 40\]"):
        mla_attention(
            jnp.asarray(batch.q[..., :-1]),
            jnp.asarray(batch.latent),
            jnp.asarray(batch.kv_cache),
            batch.md,
            up(batch),
            sm_scale=SM_SCALE,
        )
