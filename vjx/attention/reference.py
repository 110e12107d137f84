"""The pure-jnp paged attention backend: the CPU default and every kernel's oracle.

Legend: T tokens, R request rows, N query heads, K kv heads, G query heads per kv head
(N = K * G), H head dim, Hv value dim (H but for MLA), P pages (blocks), S page size, W
block-table width, L keys of one chunk (C pages * S).

The cache of one layer is one array `[2, P, S, K, H]`: index 0 holds keys, 1 values; flat
slot `block_id * S + offset` addresses one token's row. An fp8 cache holds k / k_scale and
v / v_scale (vjx/kernels/kv_quant.py); each gathered chunk is dequantized to q's dtype as it
is read.

Attention walks each token's own block-table row in chunks of C pages with an online
softmax, so memory stays `T x L x K x H` per chunk instead of `T x max_model_len`, and the
loop runs only as many chunks as the longest real sequence of the step needs. With attention
sinks the softmax starts from each head's sink (running max = sink, sum = exp(0) = 1) instead
of from an empty one, which folds the sink into the denominator at no cost per chunk.

The loop reads the cache through a `PagedKV`, so another layout reuses it: MLA's latent
cache (vjx/attention/mla.py), whose values are a slice of its keys.
"""

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Bool, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.kv_quant import dequantize, is_quantized, kv_scales, quantize

# Finite, so a fully masked chunk gives exp(0) * 0 instead of inf - inf = NaN.
MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class TokenRows:
    """Each token's row, its position in that row, and whether it is a real token."""

    row: Int[Array, " T"]
    position: Int[Array, " T"]
    """Index of the token's own key in its row's sequence (end-aligned causal)."""
    is_valid: Bool[Array, " T"]


@dataclasses.dataclass(frozen=True)
class PagedKV:
    """One layer's paged cache as the softmax loop reads it, whatever the cache's layout."""

    read_chunk: Callable[[Int[Array, "T C"]], tuple[Float[Array, "T L K H"], Float[Array, "T L K Hv"]]]
    """Each token's keys and values in the C pages whose ids it is given, in the query's dtype."""
    block_size: int
    num_kv_heads: int
    value_dim: int
    """Hv: the width of one value, which may differ from the key's (MLA)."""


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How raw q.k products become logits and which keys each query may see."""

    sm_scale: float
    sliding_window: int | None
    soft_cap: float | None


@dataclasses.dataclass(frozen=True)
class ReferenceBackend:
    """Pure-jnp ragged paged attention; hashable, so a module can hold it as a static field."""

    name: ClassVar[str] = "reference"
    kv_cache_axes: ClassVar[tuple[str | None, ...]] = (None, None, None, "kv_heads", "head_dim")
    keys_per_chunk: int = 128
    """Keys (pages * page size) gathered per token in one step of the softmax loop."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def forward(
        self,
        q: Float[Array, "T N H"],
        k: Float[Array, "T K H"],
        v: Float[Array, "T K H"],
        kv_cache: Float[Array, "2 P S K H"],
        md: AttentionMetadata,
        *,
        sm_scale: float,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
        k_scale: Float[Array, ""] | None = None,
        v_scale: Float[Array, ""] | None = None,
        sinks: Float[Array, " N"] | None = None,
    ) -> tuple[Float[Array, "T N H"], Float[Array, "2 P S K H"]]:
        """Writes k/v at `md.slot_mapping`, then attends every token to its row's keys."""
        check_scoring(sliding_window, soft_cap)
        kv_cache = write_kv(kv_cache, k, v, md.slot_mapping, k_scale, v_scale)
        paged_kv = paged_kv_reader(kv_cache, kv_scales(k_scale, v_scale), q.dtype)
        out = self.attend(q, paged_kv, md, Scoring(sm_scale, sliding_window, soft_cap), sinks)
        return out, kv_cache

    def attend(
        self,
        q: Float[Array, "T N H"],
        paged_kv: PagedKV,
        md: AttentionMetadata,
        scoring: Scoring,
        sinks: Float[Array, " N"] | None = None,
    ) -> Float[Array, "T N Hv"]:
        """Attends every token to its row's keys (already written), chunk by chunk."""
        tokens = token_rows(md, q.shape[0])
        out, _ = self._softmax(q, paged_kv, md, tokens, scoring, sinks)
        return out

    def attend_context(
        self, q: Float[Array, "T N H"], paged_kv: PagedKV, md: AttentionMetadata, scoring: Scoring
    ) -> tuple[Float[Array, "T N Hv"], Float[Array, "T N"]]:
        """Attends every token to its row's context only, the keys cached before this step,
        and returns the softmax's log-sum-exp with the output (-inf and 0 where a row has no
        context), so that another pass over the step's own keys can be merged in."""
        tokens = token_rows(md, q.shape[0], context_only=True)
        return self._softmax(q, paged_kv, md, tokens, scoring, sinks=None)

    def attend_step(
        self,
        q: Float[Array, "T N H"],
        k: Float[Array, "T K H"],
        v: Float[Array, "T K Hv"],
        md: AttentionMetadata,
        scoring: Scoring,
    ) -> tuple[Float[Array, "T N Hv"], Float[Array, "T N"]]:
        """Attends every token to the step's own keys of its row only (causal), given as
        arrays instead of read from the cache, and returns the log-sum-exp with the output:
        the other half of `attend_context`. Walks the step's real tokens in blocks of
        `keys_per_chunk` keys."""
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads, value_dim = k.shape[1], v.shape[-1]
        block = min(self.keys_per_chunk, num_tokens)
        padded = -(-num_tokens // block) * block
        k, v = (jnp.pad(x, ((0, padded - num_tokens), (0, 0), (0, 0))) for x in (k, v))
        tokens = token_rows(md, num_tokens)
        keys = token_rows(md, padded)
        q_TKGH = q.reshape(num_tokens, num_kv_heads, num_heads // num_kv_heads, head_dim)

        def block_step(index, carry):
            start = index * block
            k_LKH, v_LKHv = (jax.lax.dynamic_slice_in_dim(x, start, block) for x in (k, v))
            s_TKGL = jnp.einsum("tkgh,lkh->tkgl", q_TKGH, k_LKH, preferred_element_type=jnp.float32)
            row, position, is_valid = (
                jax.lax.dynamic_slice_in_dim(x, start, block) for x in (keys.row, keys.position, keys.is_valid)
            )
            is_visible = _visible_step_keys(tokens, TokenRows(row, position, is_valid), scoring.sliding_window)
            return fold_chunk(carry, s_TKGL, is_visible, scoring, "tkgl,lkv->tkgv", v_LKHv)

        stats_shape = q_TKGH.shape[:-1]
        init = (*initial_stats(stats_shape, None), jnp.zeros((*stats_shape, value_dim), jnp.float32))
        num_blocks = -(-md.query_start_loc[md.num_seqs[0]] // block)
        out_TKGHv, lse_TKG = normalize(jax.lax.fori_loop(0, num_blocks, block_step, init))
        out = out_TKGHv.reshape(num_tokens, num_heads, value_dim).astype(q.dtype)
        return out, lse_TKG.reshape(num_tokens, num_heads)

    def _softmax(
        self,
        q: Float[Array, "T N H"],
        paged_kv: PagedKV,
        md: AttentionMetadata,
        tokens: TokenRows,
        scoring: Scoring,
        sinks: Float[Array, " N"] | None,
    ) -> tuple[Float[Array, "T N Hv"], Float[Array, "T N"]]:
        """The online softmax over the keys each token sees, and its log-sum-exp."""
        num_tokens, num_heads, head_dim = q.shape
        block_size, num_kv_heads = paged_kv.block_size, paged_kv.num_kv_heads
        pages_per_chunk = max(1, self.keys_per_chunk // block_size)
        block_tables = pad_width(md.block_tables, pages_per_chunk)
        q_TKGH = q.reshape(num_tokens, num_kv_heads, num_heads // num_kv_heads, head_dim)
        chunk_step = own_chunk_step(paged_kv, block_tables, pages_per_chunk, q_TKGH, tokens, scoring)
        stats_shape = q_TKGH.shape[:-1]
        init = (*initial_stats(stats_shape, sinks), jnp.zeros((*stats_shape, paged_kv.value_dim), jnp.float32))
        max_chunks = block_tables.shape[1] // pages_per_chunk
        num_chunks = chunk_end(tokens, pages_per_chunk * block_size, max_chunks)
        out_TKGHv, lse_TKG = normalize(jax.lax.fori_loop(0, num_chunks, chunk_step, init))
        out = out_TKGHv.reshape(num_tokens, num_heads, paged_kv.value_dim).astype(q.dtype)
        return out, lse_TKG.reshape(num_tokens, num_heads)


def check_scoring(sliding_window: int | None, soft_cap: float | None) -> None:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}.")
    if soft_cap is not None and soft_cap <= 0:
        raise ValueError(f"soft_cap must be > 0 or None, got {soft_cap}.")


def paged_kv_reader(kv_cache: Float[Array, "2 P S K H"], scales: Float[Array, "2"] | None, dtype: DTypeLike) -> PagedKV:
    """The `[2, P, S, K, H]` cache's reader; an fp8 chunk is dequantized to `dtype` as it is read."""
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    scales = (None, None) if scales is None else scales

    def read_chunk(pages_TC):
        num_tokens, num_pages = pages_TC.shape
        # Keys and values in two gathers: XLA:CPU copies one [2, ...] gather at half the speed.
        k_TLKH, v_TLKH = (
            kv_cache[i][pages_TC].reshape(num_tokens, num_pages * block_size, num_kv_heads, head_dim) for i in (0, 1)
        )
        if is_quantized(kv_cache.dtype):
            k_TLKH, v_TLKH = (dequantize(x, s, dtype) for x, s in ((k_TLKH, scales[0]), (v_TLKH, scales[1])))
        return k_TLKH, v_TLKH

    return PagedKV(read_chunk, block_size, num_kv_heads, head_dim)


def write_kv(
    kv_cache: Float[Array, "2 P S K H"],
    k: Float[Array, "T K H"],
    v: Float[Array, "T K H"],
    slot_mapping: Int[Array, " T"],
    k_scale: Float[Array, ""] | None = None,
    v_scale: Float[Array, ""] | None = None,
) -> Float[Array, "2 P S K H"]:
    """Scatters each token's k/v row to its flat slot; padding tokens all land in block 0.
    The scales apply to an fp8 cache only (None: 1.0)."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.reshape(2, num_blocks * block_size, num_kv_heads, head_dim)
    rows = [quantize(x, scale, kv_cache.dtype) for x, scale in ((k, k_scale), (v, v_scale))]
    flat = flat.at[:, slot_mapping].set(jnp.stack(rows))
    return flat.reshape(kv_cache.shape)


def token_rows(md: AttentionMetadata, num_tokens: int, *, context_only: bool = False) -> TokenRows:
    """Each token's row (from `query_start_loc`) and its end-aligned position in that row;
    `context_only` puts every token at its row's last cached key instead, so that it sees the
    context and none of the step's own keys."""
    starts = md.query_start_loc
    num_rows = md.seq_lens.shape[0]
    token = jnp.arange(num_tokens, dtype=starts.dtype)
    row = jnp.searchsorted(starts[1:], token, side="right")
    is_valid = token < starts[md.num_seqs[0]]
    row = jnp.minimum(row, num_rows - 1).astype(starts.dtype)
    query_len = starts[row + 1] - starts[row]
    offset = -1 if context_only else token - starts[row]
    position = md.seq_lens[row] - query_len + offset
    return TokenRows(row=row, position=position, is_valid=is_valid)


def pad_width(block_tables: Int[Array, "R W"], multiple: int) -> Int[Array, "R W2"]:
    """Pads the block table with block 0 to whole chunks, so no chunk slice is clamped."""
    width = block_tables.shape[1]
    padded = -(-width // multiple) * multiple
    return jnp.pad(block_tables, ((0, 0), (0, padded - width)))


def chunk_end(tokens: TokenRows, keys_per_chunk: int, max_chunks: int) -> Int[Array, ""]:
    """Chunks the furthest key any real token sees needs (the loop's trip count): its row's
    last key, or with `context_only` its last cached one (none for fresh prompts)."""
    num_keys = jnp.max(jnp.where(tokens.is_valid, tokens.position + 1, 0))
    return jnp.minimum(-(-num_keys // keys_per_chunk), max_chunks)


def initial_stats(stats_shape: tuple[int, ...], sinks: Float[Array, " N"] | None) -> tuple[Array, Array]:
    """The running max m and sum l [T, K, G] of a softmax over no key yet: empty, or holding
    only the head's sink (m = sink, l = exp(0) = 1)."""
    if sinks is None:
        return jnp.full(stats_shape, MASK_VALUE, jnp.float32), jnp.zeros(stats_shape, jnp.float32)
    m_TKG = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(stats_shape[1:]), stats_shape)
    return m_TKG, jnp.ones(stats_shape, jnp.float32)


def normalize(stats: tuple[Array, Array, Array]) -> tuple[Array, Array]:
    """The softmax output acc / l and its log-sum-exp m + log(l). Tokens that see no key
    (padding) have acc == 0, and l == 0 unless sinks: they get 0, not NaN, and -inf."""
    m_TKG, l_TKG, acc_TKGHv = stats
    sees_keys = l_TKG > 0
    safe_l = jnp.where(sees_keys, l_TKG, 1.0)
    out_TKGHv = jnp.where(sees_keys[..., None], acc_TKGHv / safe_l[..., None], 0.0)
    return out_TKGHv, jnp.where(sees_keys, m_TKG + jnp.log(safe_l), -jnp.inf)


def own_chunk_step(
    paged_kv: PagedKV,
    block_tables: Int[Array, "R W"],
    pages_per_chunk: int,
    q_TKGH: Float[Array, "T K G H"],
    tokens: TokenRows,
    scoring: Scoring,
):
    """The loop body `(chunk, carry) -> carry` that folds chunk `chunk` of each token's own
    row's pages (`block_tables` padded to whole chunks) into the running statistics."""

    def chunk_step(chunk, carry):
        pages_RC = jax.lax.dynamic_slice_in_dim(block_tables, chunk * pages_per_chunk, pages_per_chunk, axis=1)
        kv_chunk = paged_kv.read_chunk(pages_RC[tokens.row])
        first_key = chunk * pages_per_chunk * paged_kv.block_size
        return online_softmax_step(carry, q_TKGH, kv_chunk, first_key, tokens, scoring)

    return chunk_step


def online_softmax_step(
    carry: tuple[Array, Array, Array],
    q_TKGH: Float[Array, "T K G H"],
    kv_chunk: tuple[Float[Array, "T L K H"], Float[Array, "T L K Hv"]],
    first_key: Int[Array, ""],
    tokens: TokenRows,
    scoring: Scoring,
) -> tuple[Array, Array, Array]:
    """Folds one chunk of each token's own keys into the running statistics."""
    k_TLKH, v_TLKHv = kv_chunk
    s_TKGL = jnp.einsum("tkgh,tlkh->tkgl", q_TKGH, k_TLKH, preferred_element_type=jnp.float32)
    is_visible = visible_keys(first_key, k_TLKH.shape[1], tokens, scoring.sliding_window)
    return fold_chunk(carry, s_TKGL, is_visible, scoring, "tkgl,tlkv->tkgv", v_TLKHv)


def fold_chunk(
    carry: tuple[Array, Array, Array],
    s_TKGL: Float[Array, "T K G L"],
    is_visible: Bool[Array, "T L"],
    scoring: Scoring,
    pv_spec: str,
    v: Float[Array, "..."],
) -> tuple[Array, Array, Array]:
    """Folds one chunk's raw scores into the running max m, sum l and output acc (all
    float32); `pv_spec` multiplies the chunk's probabilities with its values `v`."""
    m_TKG, l_TKG, acc_TKGHv = carry
    s_TKGL = s_TKGL * scoring.sm_scale
    if scoring.soft_cap is not None:
        s_TKGL = scoring.soft_cap * jnp.tanh(s_TKGL / scoring.soft_cap)
    is_visible = is_visible[:, None, None, :]
    s_TKGL = jnp.where(is_visible, s_TKGL, MASK_VALUE)
    m_new = jnp.maximum(m_TKG, s_TKGL.max(axis=-1))
    p_TKGL = jnp.where(is_visible, jnp.exp(s_TKGL - m_new[..., None]), 0.0)
    alpha = jnp.exp(m_TKG - m_new)
    l_new = l_TKG * alpha + p_TKGL.sum(axis=-1)
    pv_TKGHv = jnp.einsum(pv_spec, p_TKGL, v.astype(jnp.float32))
    return m_new, l_new, acc_TKGHv * alpha[..., None] + pv_TKGHv


def visible_keys(
    first_key: Int[Array, ""], num_keys: int, tokens: TokenRows, sliding_window: int | None
) -> Bool[Array, "T L"]:
    """Causal (end-aligned) and sliding-window visibility of one chunk's keys."""
    key_pos = first_key + jnp.arange(num_keys)
    query_pos = tokens.position[:, None]
    is_visible = tokens.is_valid[:, None] & (key_pos[None, :] <= query_pos)
    if sliding_window is not None:
        is_visible &= key_pos[None, :] > query_pos - sliding_window
    return is_visible


def _visible_step_keys(tokens: TokenRows, keys: TokenRows, sliding_window: int | None) -> Bool[Array, "T L"]:
    """Which of a block of the step's own tokens, as keys, each query token sees: those of its
    own row, causal, within the sliding window."""
    query_pos, key_pos = tokens.position[:, None], keys.position[None, :]
    is_visible = tokens.is_valid[:, None] & keys.is_valid[None, :] & (tokens.row[:, None] == keys.row[None, :])
    is_visible &= key_pos <= query_pos
    if sliding_window is not None:
        is_visible &= key_pos > query_pos - sliding_window
    return is_visible
