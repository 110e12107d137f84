"""Paged MLA attention (vjx/attention/mla.py) against a dense float64 numpy oracle.

One ragged step: a decode row whose keys span two softmax chunks, a prefill chunk continuing
a cached prefix, a fresh prompt, then a padding row and padding tokens. Pages are drawn in
random order (never block 0, the scratch block); the slots no row owns hold stale random
latents that attention must not read.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.mla import mla_attention, mla_kv_cache_shape

NUM_TOKENS = 64  # T
NUM_ROWS = 4  # R
NUM_HEADS = 4  # N
KV_LORA_RANK = 32  # Lr
ROPE_DIM = 16
LATENT_DIM = KV_LORA_RANK + ROPE_DIM  # Lk
BLOCK_SIZE = 16  # S
MAX_MODEL_LEN = 256
SM_SCALE = 0.125
# (cached tokens, new tokens): decode over 151 keys (two chunks of 128), a chunked prefill,
# a fresh prompt; row 3 is padding.
REQUESTS = [(150, 1), (40, 25), (0, 30)]


@dataclasses.dataclass(frozen=True)
class Batch:
    q_latent: np.ndarray  # [T, N, Lk]
    latent: np.ndarray  # [T, Lk]: this step's latents
    kv_cache: np.ndarray  # [P, S, Lk] before the step
    md: AttentionMetadata
    block_ids: list[list[int]]
    slot_mapping: np.ndarray  # [T]


def make_batch(seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    width = MAX_MODEL_LEN // BLOCK_SIZE
    num_blocks = NUM_ROWS * width + 1
    free_blocks = list(rng.permutation(np.arange(1, num_blocks)))
    query_start_loc = np.zeros(NUM_ROWS + 1, np.int32)
    seq_lens = np.zeros(NUM_ROWS, np.int32)
    block_tables = np.zeros((NUM_ROWS, width), np.int32)
    slot_mapping = np.zeros(NUM_TOKENS, np.int32)  # padding tokens -> scratch block 0
    block_ids, start = [], 0
    for row, (num_cached, num_new) in enumerate(REQUESTS):
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
    query_start_loc[len(REQUESTS) + 1 :] = start
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(slot_mapping),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(block_tables),
        num_seqs=jnp.asarray([len(REQUESTS)], np.int32),
    )
    return Batch(
        q_latent=rng.standard_normal((NUM_TOKENS, NUM_HEADS, LATENT_DIM), np.float32),
        latent=rng.standard_normal((NUM_TOKENS, LATENT_DIM), np.float32),
        kv_cache=rng.standard_normal(mla_kv_cache_shape(num_blocks, BLOCK_SIZE, LATENT_DIM), np.float32),
        md=md,
        block_ids=block_ids,
        slot_mapping=slot_mapping,
    )


def dense_mla(batch: Batch) -> np.ndarray:
    """Absorbed MLA per request and query token, in float64: scores over whole latents,
    values their first kv_lora_rank dims; padding tokens stay 0."""
    flat = batch.kv_cache.reshape(-1, LATENT_DIM).astype(np.float64)
    out = np.zeros((NUM_TOKENS, NUM_HEADS, KV_LORA_RANK), np.float64)
    start = 0
    for row, (num_cached, num_new) in enumerate(REQUESTS):
        positions = np.arange(num_cached)
        blocks = np.asarray(batch.block_ids[row])
        cached = flat[blocks[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE]
        latents = np.concatenate([cached, batch.latent[start : start + num_new]])
        for i in range(num_new):
            visible = latents[: num_cached + i + 1]
            scores = batch.q_latent[start + i].astype(np.float64) @ visible.T * SM_SCALE  # [N, keys]
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[start + i] = weights @ visible[:, :KV_LORA_RANK] / weights.sum(axis=-1, keepdims=True)
        start += num_new
    return out


@functools.partial(jax.jit, donate_argnames="kv_cache")
def _mla(q_latent, latent, kv_cache, md):
    return mla_attention(q_latent, latent, kv_cache, md, sm_scale=SM_SCALE, kv_lora_rank=KV_LORA_RANK)


@pytest.fixture(scope="module")
def batch() -> Batch:
    return make_batch()


@pytest.fixture(scope="module")
def result(batch):
    out, kv_cache = _mla(jnp.asarray(batch.q_latent), jnp.asarray(batch.latent), jnp.asarray(batch.kv_cache), batch.md)
    return np.asarray(out), np.asarray(kv_cache)


def test_cache_shape_has_one_latent_per_slot():
    assert mla_kv_cache_shape(10, BLOCK_SIZE, LATENT_DIM) == (10, 16, 48)


def test_matches_dense_mla(batch, result):
    out, _ = result
    num_real = sum(num_new for _, num_new in REQUESTS)
    expected = dense_mla(batch)
    assert out.shape == (NUM_TOKENS, NUM_HEADS, KV_LORA_RANK)
    error = np.abs(out[:num_real] - expected[:num_real]).max() / np.abs(expected[:num_real]).max()
    assert error < 1e-5
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"


def test_cache_holds_the_written_latents_at_their_slots(batch, result):
    _, kv_cache = result
    num_real = sum(num_new for _, num_new in REQUESTS)
    flat, before = kv_cache.reshape(-1, LATENT_DIM), batch.kv_cache.reshape(-1, LATENT_DIM)
    real_slots = batch.slot_mapping[:num_real]
    np.testing.assert_array_equal(flat[real_slots], batch.latent[:num_real])
    untouched = np.ones(len(flat), bool)
    untouched[real_slots] = False
    untouched[:BLOCK_SIZE] = False  # block 0 takes the padding tokens' latents
    np.testing.assert_array_equal(flat[untouched], before[untouched])


@pytest.mark.parametrize("kv_lora_rank", [0, LATENT_DIM + 1])
def test_rejects_a_rank_outside_the_latent(batch, kv_lora_rank):
    with pytest.raises(ValueError, match="kv_lora_rank must be in"):
        mla_attention(
            jnp.asarray(batch.q_latent),
            jnp.asarray(batch.latent),
            jnp.asarray(batch.kv_cache),
            batch.md,
            sm_scale=SM_SCALE,
            kv_lora_rank=kv_lora_rank,
        )
