"""The CPU attention backend: the reference's cache and online softmax, walked a block of
query tokens at a time, so that a prefill reads its row's pages once per block, not once
per token.

Legend: as vjx/attention/reference.py; B query tokens of one block (`query_block`).

The reference gathers, for every query token, the pages of its own row. That is the least a
decode token can read (it is its row's only token), but a 128-token prefill chunk reads its
row's keys 128 times, and XLA:CPU's gather copies at a fraction of the memory bandwidth.
Here the step's tokens go in blocks of B consecutive tokens (rows are contiguous in the
batch, so a block covers a run of rows):
- a block whose real tokens lie in at most `row_slots` rows (a prefill chunk, a few
  prompts) takes the row path: each of those rows' pages is read once, and all B queries
  are scored against it with one GEMM, masked to each token's own row;
- a block of more rows (decode rows, many short prompts) takes the token path, the
  reference's per-token gather, where no page is read twice for one row's single token.
Either way a block walks only the chunks between its earliest visible key (the sliding
window's start) and its furthest one, so a block of fresh prompts reads no cached page that
it cannot see.
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import (
    PagedKV,
    ReferenceBackend,
    Scoring,
    TokenRows,
    check_scoring,
    fold_chunk,
    initial_stats,
    normalize,
    online_softmax_step,
    pad_width,
    paged_kv_reader,
    token_rows,
    visible_keys,
    write_kv,
)
from vjx.kernels.kv_quant import kv_scales

_Stats = tuple[Array, Array, Array]


@dataclasses.dataclass(frozen=True)
class _Walk:
    """What every block's walk reads: the cache, its block table padded to whole chunks, and
    how scores are made."""

    paged_kv: PagedKV
    block_tables: Int[Array, "R W"]
    scoring: Scoring
    sinks: Float[Array, " N"] | None
    pages_per_chunk: int

    @property
    def keys_per_chunk(self) -> int:
        return self.pages_per_chunk * self.paged_kv.block_size

    def initial(self, q_BKGH: Float[Array, "B K G H"]) -> _Stats:
        stats_shape = q_BKGH.shape[:-1]
        acc_BKGHv = jnp.zeros((*stats_shape, self.paged_kv.value_dim), jnp.float32)
        return (*initial_stats(stats_shape, self.sinks), acc_BKGHv)

    def chunk_range(self, tokens: TokenRows) -> tuple[Int[Array, ""], Int[Array, ""]]:
        """The chunks holding keys some real token of `tokens` sees: [first, end)."""
        num_keys = jnp.max(jnp.where(tokens.is_valid, tokens.position + 1, 0))
        max_chunks = self.block_tables.shape[1] // self.pages_per_chunk
        end = jnp.minimum(-(-num_keys // self.keys_per_chunk), max_chunks)
        window = self.scoring.sliding_window
        if window is None:
            return jnp.zeros_like(end), end
        lowest_key = jnp.min(jnp.where(tokens.is_valid, tokens.position - window + 1, num_keys))
        return jnp.maximum(lowest_key, 0) // self.keys_per_chunk, end


@dataclasses.dataclass(frozen=True)
class CpuBackend:
    """Blocked ragged paged attention in jnp for XLA:CPU; hashable (a static field)."""

    name: ClassVar[str] = "cpu"
    kv_cache_axes: ClassVar[tuple[str | None, ...]] = ReferenceBackend.kv_cache_axes
    query_block: int = 128
    """B: query tokens scored together."""
    keys_per_chunk: int = 128
    """Keys (pages * page size) read per row or token in one step of the softmax loop."""
    row_slots: int = 8
    """The most rows a block may span and still take the row path."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return ReferenceBackend().kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)

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
        pages_per_chunk = max(1, self.keys_per_chunk // paged_kv.block_size)
        block_tables = pad_width(md.block_tables, pages_per_chunk)
        walk = _Walk(paged_kv, block_tables, Scoring(sm_scale, sliding_window, soft_cap), sinks, pages_per_chunk)
        return self._attend(q, md, walk), kv_cache

    def _attend(self, q: Float[Array, "T N H"], md: AttentionMetadata, walk: _Walk) -> Float[Array, "T N Hv"]:
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads, value_dim = walk.paged_kv.num_kv_heads, walk.paged_kv.value_dim
        block = min(self.query_block, num_tokens)
        padded = -(-num_tokens // block) * block
        q_TKGH = jnp.pad(q, ((0, padded - num_tokens), (0, 0), (0, 0)))
        q_TKGH = q_TKGH.reshape(padded, num_kv_heads, num_heads // num_kv_heads, head_dim)
        tokens = token_rows(md, padded)

        def block_step(index, out_TKGHv):
            start = index * block
            q_BKGH = jax.lax.dynamic_slice_in_dim(q_TKGH, start, block)
            fields = (tokens.row, tokens.position, tokens.is_valid)
            block_tokens = TokenRows(*(jax.lax.dynamic_slice_in_dim(x, start, block) for x in fields))
            num_rows = _num_rows(block_tokens)
            stats = jax.lax.cond(
                num_rows <= self.row_slots,
                lambda: _row_path(walk, q_BKGH, block_tokens, num_rows),
                lambda: _token_path(walk, q_BKGH, block_tokens),
            )
            out_BKGHv, _ = normalize(stats)
            return jax.lax.dynamic_update_slice_in_dim(out_TKGHv, out_BKGHv.astype(q.dtype), start, 0)

        out = jnp.zeros((padded, *q_TKGH.shape[1:3], value_dim), q.dtype)
        num_blocks = -(-md.query_start_loc[md.num_seqs[0]] // block)
        out = jax.lax.fori_loop(0, num_blocks, block_step, out)
        return out[:num_tokens].reshape(num_tokens, num_heads, value_dim)


def _num_rows(tokens: TokenRows) -> Int[Array, ""]:
    """Rows a block's real tokens lie in (its first token is real: blocks past the last real
    token are never walked)."""
    first_row = tokens.row[0]
    return jnp.max(jnp.where(tokens.is_valid, tokens.row, first_row)) - first_row + 1


def _row_path(walk: _Walk, q_BKGH: Float[Array, "B K G H"], tokens: TokenRows, num_rows: Int[Array, ""]) -> _Stats:
    """Reads each of the block's rows' chunks once and scores every query of the block
    against it, masked to the queries of that row."""
    first_row = tokens.row[0]
    keys_per_chunk = walk.keys_per_chunk

    def row_step(offset, carry):
        row = first_row + offset
        row_tokens = dataclasses.replace(tokens, is_valid=tokens.is_valid & (tokens.row == row))
        pages_W = walk.block_tables[row]

        def chunk_step(chunk, carry):
            pages_C = jax.lax.dynamic_slice_in_dim(pages_W, chunk * walk.pages_per_chunk, walk.pages_per_chunk)
            k_1LKH, v_1LKHv = walk.paged_kv.read_chunk(pages_C[None])
            s_BKGL = jnp.einsum("bkgh,lkh->bkgl", q_BKGH, k_1LKH[0], preferred_element_type=jnp.float32)
            is_visible = visible_keys(chunk * keys_per_chunk, keys_per_chunk, row_tokens, walk.scoring.sliding_window)
            return fold_chunk(carry, s_BKGL, is_visible, walk.scoring, "bkgl,lkv->bkgv", v_1LKHv[0])

        first, end = walk.chunk_range(row_tokens)
        return jax.lax.fori_loop(first, end, chunk_step, carry)

    return jax.lax.fori_loop(0, num_rows, row_step, walk.initial(q_BKGH))


def _token_path(walk: _Walk, q_BKGH: Float[Array, "B K G H"], tokens: TokenRows) -> _Stats:
    """Gathers each token's own row's chunk, as the reference does."""

    def chunk_step(chunk, carry):
        first_page = chunk * walk.pages_per_chunk
        pages_RC = jax.lax.dynamic_slice_in_dim(walk.block_tables, first_page, walk.pages_per_chunk, axis=1)
        kv_chunk = walk.paged_kv.read_chunk(pages_RC[tokens.row])
        return online_softmax_step(carry, q_BKGH, kv_chunk, chunk * walk.keys_per_chunk, tokens, walk.scoring)

    first, end = walk.chunk_range(tokens)
    return jax.lax.fori_loop(first, end, chunk_step, walk.initial(q_BKGH))
