"""Random ragged paged batches for the attention kernel tests, and a float64 numpy oracle.

A batch is a list of requests `(num_cached, num_new)`; row r holds request r, later rows are
padding (seq_len 0, empty query range). Pages are drawn in random order (never block 0, the
scratch block); every cache element that is not one of a row's keys is NaN, so a kernel that
reads a stray page or a slot past `seq_len` turns its output to NaN.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from vjx.attention.metadata import AttentionMetadata


@dataclasses.dataclass(frozen=True)
class BatchShape:
    num_tokens: int  # T
    num_rows: int  # R
    num_heads: int  # N
    num_kv_heads: int  # K
    head_dim: int  # H
    page_size: int  # S
    max_model_len: int


@dataclasses.dataclass(frozen=True)
class RaggedBatch:
    shape: BatchShape
    requests: list[tuple[int, int]]
    q: np.ndarray  # [T, N, H]
    k: np.ndarray  # [T, K, H]: this step's keys (already in the cache)
    v: np.ndarray  # [T, K, H]
    kv_cache: np.ndarray  # [2, K, P, S, H], NaN outside the rows' keys
    md: AttentionMetadata
    dtype: np.dtype

    def device_arrays(self):
        """q, k, v and the cache as device arrays of the batch's dtype."""
        return tuple(jnp.asarray(x, self.dtype) for x in (self.q, self.k, self.v, self.kv_cache))

    def real_tokens(self) -> int:
        return sum(num_new for _, num_new in self.requests)


def _rounded(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Standard normal values already rounded to `dtype` (so the oracle sees the same inputs)."""
    return np.array(jnp.asarray(rng.standard_normal(shape, np.float32), dtype), np.float32)


def make_batch(requests, shape: BatchShape, dtype=jnp.float32, seed: int = 0) -> RaggedBatch:
    rng = np.random.default_rng(seed)
    s = shape
    width = -(-s.max_model_len // s.page_size)
    num_pages = s.num_rows * width + 1
    free_pages = list(rng.permutation(np.arange(1, num_pages)))
    kv_cache = np.full((2, s.num_kv_heads, num_pages, s.page_size, s.head_dim), np.nan, np.float32)
    query_start_loc = np.zeros(s.num_rows + 1, np.int32)
    seq_lens = np.zeros(s.num_rows, np.int32)
    block_tables = np.zeros((s.num_rows, width), np.int32)
    slot_mapping = np.arange(s.num_tokens, dtype=np.int32) % s.page_size  # padding -> block 0
    k = _rounded(rng, (s.num_tokens, s.num_kv_heads, s.head_dim), dtype)
    v = _rounded(rng, (s.num_tokens, s.num_kv_heads, s.head_dim), dtype)
    start = 0
    for row, (num_cached, num_new) in enumerate(requests):
        seq_len = num_cached + num_new
        pages = np.asarray([free_pages.pop() for _ in range(-(-seq_len // s.page_size))], np.int32)
        block_tables[row, : len(pages)] = pages
        positions = np.arange(seq_len)
        page_of, offset_of = pages[positions // s.page_size], positions % s.page_size
        kv_cache[:, :, page_of, offset_of] = _rounded(rng, (2, s.num_kv_heads, seq_len, s.head_dim), dtype)
        new = slice(start, start + num_new)
        slots = page_of[num_cached:] * s.page_size + offset_of[num_cached:]
        slot_mapping[new] = slots
        k[new] = kv_cache[0, :, page_of[num_cached:], offset_of[num_cached:]]
        v[new] = kv_cache[1, :, page_of[num_cached:], offset_of[num_cached:]]
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
    q = _rounded(rng, (s.num_tokens, s.num_heads, s.head_dim), dtype)
    return RaggedBatch(s, list(requests), q, k, v, kv_cache, md, dtype)


def dense_attention(batch: RaggedBatch, sm_scale: float, sliding_window=None, soft_cap=None, sinks=None):
    """Causal (end-aligned) attention per row in float64 over dense keys; padding tokens 0.

    `sinks` (one per query head): each head's sink joins its softmax as one more logit after
    the soft cap and the masks, and its weight is dropped."""
    s = batch.shape
    group = s.num_heads // s.num_kv_heads
    sinks_KG1 = None if sinks is None else np.asarray(sinks, np.float64).reshape(s.num_kv_heads, group, 1)
    out = np.zeros(batch.q.shape, np.float64)
    block_tables = np.asarray(batch.md.block_tables)
    start = 0
    for row, (num_cached, num_new) in enumerate(batch.requests):
        seq_len = num_cached + num_new
        positions = np.arange(seq_len)
        pages = block_tables[row, positions // s.page_size]
        keys, values = batch.kv_cache[:, :, pages, positions % s.page_size].astype(np.float64)
        q = batch.q[start : start + num_new].astype(np.float64)
        q = q.reshape(num_new, s.num_kv_heads, group, s.head_dim)
        scores = np.einsum("qkgh,klh->kgql", q, keys) * sm_scale
        if soft_cap is not None:
            scores = soft_cap * np.tanh(scores / soft_cap)
        query_pos = num_cached + np.arange(num_new)[:, None]
        visible = positions[None, :] <= query_pos
        if sliding_window is not None:
            visible &= positions[None, :] > query_pos - sliding_window
        scores = np.where(visible, scores, -np.inf)
        peak = scores.max(axis=-1, keepdims=True)
        if sinks_KG1 is not None:
            peak = np.maximum(peak, sinks_KG1[..., None])
        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        if sinks_KG1 is not None:
            total = total + np.exp(sinks_KG1[..., None] - peak)
        weights /= total
        rows = np.einsum("kgql,klh->qkgh", weights, values)
        out[start : start + num_new] = rows.reshape(num_new, s.num_heads, s.head_dim)
        start += num_new
    return out


def relative_error(out: np.ndarray, expected: np.ndarray) -> float:
    """||out - expected|| / ||expected|| over all elements (NaN anywhere gives NaN)."""
    out = np.asarray(out, np.float64)
    return float(np.linalg.norm(out - expected) / np.linalg.norm(expected))
