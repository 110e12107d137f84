"""The CPU attention backend: the reference's cache and online softmax, walked a block of
query tokens at a time, so that each row's pages are read once per block, not once per token.

Legend: as vjx/attention/reference.py; B query tokens of one block (`query_block`).

The reference gathers, for every query token, the pages of its own row: a 128-token prefill
chunk reads its row's keys 128 times, and XLA:CPU's gather copies at a fraction of the memory
bandwidth. Here the step's tokens go in blocks of B consecutive tokens (a row's tokens are
contiguous, so a block covers a run of rows), and each block takes one of two paths:
- a block of at most `row_slots` rows (prefill chunks) walks them one by one: each chunk of a
  row's pages is read once, and the block's B queries are scored against it with one GEMM,
  masked to that row's queries;
- a block of more rows (decode rows, short prompts) gathers each token's own chunk, the
  whole block in one gather, as the reference does: walking 16 one-token rows costs a
  small GEMM and a small gather a row, which XLA:CPU runs at a fraction of its speed
  (SmolLM2's shapes on 2 cores: 64 decode rows walked took 3x the gather's time).
Either way a row's chunks run from its earliest visible key (the sliding window's start) to
its furthest one, so a block of fresh prompts reads no other cached page.
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
    chunk_end,
    fold_chunk,
    initial_stats,
    normalize,
    own_chunk_step,
    pad_width,
    token_rows,
    visible_keys,
)

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
        end = chunk_end(tokens, self.keys_per_chunk, self.block_tables.shape[1] // self.pages_per_chunk)
        window = self.scoring.sliding_window
        if window is None:
            return jnp.zeros_like(end), end
        lowest_key = jnp.min(jnp.where(tokens.is_valid, tokens.position - window + 1, end * self.keys_per_chunk))
        return jnp.maximum(lowest_key, 0) // self.keys_per_chunk, end


@dataclasses.dataclass(frozen=True)
class CpuBackend(ReferenceBackend):
    """Ragged paged attention in jnp, by blocks of queries, for XLA:CPU: the reference's
    cache, write and checks, its own walk; hashable (a static field)."""

    name: ClassVar[str] = "cpu"
    query_block: int = 32
    """B: query tokens scored together (a block's first token is real: blocks past the last
    real token are not walked). `keys_per_chunk`: keys of a row read in one step of the loop."""
    row_slots: int = 4
    """The most rows a block may span and still walk them one by one."""

    def attend(
        self,
        q: Float[Array, "T N H"],
        paged_kv: PagedKV,
        md: AttentionMetadata,
        scoring: Scoring,
        sinks: Float[Array, " N"] | None = None,
    ) -> Float[Array, "T N Hv"]:
        """Attends every token to its row's keys (already written), a block of queries at a time."""
        pages_per_chunk = max(1, self.keys_per_chunk // paged_kv.block_size)
        block_tables = pad_width(md.block_tables, pages_per_chunk)
        return self._attend(q, md, _Walk(paged_kv, block_tables, scoring, sinks, pages_per_chunk))

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
            first_row = block_tokens.row[0]
            num_rows = jnp.max(jnp.where(block_tokens.is_valid, block_tokens.row, first_row)) - first_row + 1
            if block <= self.row_slots:  # a block this small spans few rows: nothing to gather
                stats = _walk_rows(walk, q_BKGH, block_tokens, num_rows)
            else:
                stats = jax.lax.cond(
                    num_rows <= self.row_slots,
                    lambda: _walk_rows(walk, q_BKGH, block_tokens, num_rows),
                    lambda: _gather_tokens(walk, q_BKGH, block_tokens),
                )
            out_BKGHv, _ = normalize(stats)
            return jax.lax.dynamic_update_slice_in_dim(out_TKGHv, out_BKGHv.astype(q.dtype), start, 0)

        out = jnp.zeros((padded, num_kv_heads, num_heads // num_kv_heads, value_dim), q.dtype)
        num_blocks = -(-md.query_start_loc[md.num_seqs[0]] // block)
        out = jax.lax.fori_loop(0, num_blocks, block_step, out)
        return out[:num_tokens].reshape(num_tokens, num_heads, value_dim)


def _walk_rows(walk: _Walk, q_BKGH: Float[Array, "B K G H"], tokens: TokenRows, num_rows: Int[Array, ""]) -> _Stats:
    """A block of few rows: reads each chunk of its rows once and scores every query of the
    block against it, masked to the queries of that row."""
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


def _gather_tokens(walk: _Walk, q_BKGH: Float[Array, "B K G H"], tokens: TokenRows) -> _Stats:
    """A block of many rows (decode rows): every token reads its own row's chunks, the whole
    block in one gather a chunk, as the reference does."""
    chunk_step = own_chunk_step(walk.paged_kv, walk.block_tables, walk.pages_per_chunk, q_BKGH, tokens, walk.scoring)
    first, end = walk.chunk_range(tokens)
    return jax.lax.fori_loop(first, end, chunk_step, walk.initial(q_BKGH))
