"""Ragged paged attention on GPUs in Pallas (Triton lowering): decode, prefill and mixed steps.

Legend: T tokens, R request rows, N query heads, K kv heads, G = N // K query heads per kv
head, H head dim, P pages, S page size, W block-table width, M matmul rows of a program,
L keys of one tile, C decode programs per kv head.

The cache of one layer is `[2, K, P, S, H]` (index 0 keys, 1 values): one kv head's page is
S * H contiguous elements, so a program that walks one kv head reads whole rows of H.

One call runs two launches, and no other device work:
1. decode: rows with one query token. A row's keys are cut into `splits` segments, chosen on
   the device per row: at most `max_splits = clip(decode_programs // num_seqs, 1,
   max_kv_splits)` (so few long rows still fill the GPU without a recompile), and few enough
   that each segment holds `min_tiles_per_split` key tiles (a short row is not cut at all).
   Program (c, k) takes segment c // num_seqs of row c % num_seqs (segments outer, so the
   programs with work come first). A row of one segment writes its output directly; the
   segments of a split row write float32 partials (acc, max, sum) at slot c.
2. merge + prefill: one grid whose first programs run query blocks of rows with more than
   one query token, last blocks first (most keys first), and whose last programs fold the
   split rows' partials in log-sum-exp form (the decode launch has finished, so the
   partials are complete). Rows that were not split have nothing to merge and exit at once.
   A block finds its row from a vector load of `query_start_loc` and a prefix sum of the
   rows' block counts; the padding tokens past `query_start_loc[num_seqs]` form one more row
   whose blocks write zeros, so every output element is written exactly once and a call
   needs no zero fill. A merge loads all of a row's partials in one tile per chunk of query
   heads and folds them with reductions (no loop over the segments).
Every program packs the G query heads of its kv head into the M rows of its matmuls, so each
K/V tile is read once per kv head. Attention is causal, aligned to the end of each row; keys
are walked in tiles of L through the block table (a gather of each key's page), tiles past
the causal frontier or before the sliding window are skipped, and tiles wholly inside it run
without masks. The softmax is online, in float32, in base 2 (log2(e) folded into the scale);
that walk is kv_walk.py, shared by all three kinds of program. Over an fp8 cache the walk
reads fp8 tiles and applies the layer's `kv_scales` as it goes (kv_walk.py); no dequantized
copy of the cache is made. Attention sinks start each walk's softmax from its head's sink
(kv_walk.py); of a split decode row only the first segment does, so the merge counts the sink
once.

Every real row has at least one query token (the runner schedules no empty row), so
num_seqs <= T: grids are sized from min(R, T), not R.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

from vjx.kernels.kv_quant import compute_dtype
from vjx.kernels.kv_walk import (
    MASK_VALUE,
    Geometry,
    Scoring,
    Walk,
    cdiv,
    div,
    full_mask,
    head_rows,
    load_kv_scales,
    load_sinks,
    normalize,
    rem,
    walk_tiles,
)
from vjx.kernels.paged_prefill_mgpu import MosaicPrefillTuning, paged_prefill_attention
from vjx.kernels.paged_prefill_mgpu import supports as mosaic_supports
from vjx.kernels.tuning import AttentionTuning, KernelTuning, default_tuning

# Elements of one merge tile [splits, heads, H] (a few registers a thread).
_MERGE_TILE = 8192


@dataclasses.dataclass(frozen=True)
class Splits:
    """The split-KV policy of the decode rows (static knobs, evaluated on the device)."""

    decode_programs: int
    max_kv_splits: int
    min_tiles_per_split: int
    block_k: int  # L of the decode launch
    sliding_window: int | None

    def max_splits(self, num_seqs: Array) -> Array:
        """Segments per row at most: several for a few rows, one for many."""
        per_row = div(jnp.int32(self.decode_programs), jnp.maximum(num_seqs, 1))
        return jnp.minimum(jnp.maximum(per_row, 1), self.max_kv_splits)

    def first_key(self, seq_len: Array) -> Array:
        """The first key a decode row reads: 0, or the first of the window's first tile."""
        if self.sliding_window is None:
            return jnp.int32(0)
        return div(jnp.maximum(seq_len - self.sliding_window, 0), self.block_k) * self.block_k

    def row_splits(self, seq_len: Array, max_splits: Array) -> Array:
        """Segments of one decode row: at most `max_splits`, of `min_tiles_per_split` tiles or
        more each, and at least one."""
        num_tiles = cdiv(seq_len - self.first_key(seq_len), self.block_k)
        return jnp.minimum(jnp.maximum(cdiv(num_tiles, self.min_tiles_per_split), 1), max_splits)


def _decode_segment(seq_len: Array, split: Array, num_splits: Array, splits: Splits, walk_args: dict) -> tuple:
    """The [start, end) keys of segment `split` of a decode row and the walk over them."""
    g = walk_args["geometry"]
    first = splits.first_key(seq_len)
    per_split = cdiv(cdiv(seq_len - first, num_splits), g.block_k) * g.block_k
    start = first + split * per_split
    end = jnp.minimum(start + per_split, seq_len)
    positions = jnp.full((g.block_m,), seq_len - 1, jnp.int32)
    walk = Walk(positions=positions, kv_end=end, **walk_args)
    if walk.sinks is not None:
        # Only the first segment holds the row's sink, so the merge counts it once. The others
        # start from a sink of MASK_VALUE, which weighs exp2(MASK_VALUE - m) = 0 once they see
        # a key, and nothing in the merge if they see none (their max stays MASK_VALUE).
        walk = dataclasses.replace(walk, sinks=jnp.where(split == 0, walk.sinks, MASK_VALUE))
    num_full = div(jnp.maximum(end - start, 0), g.block_k)
    if splits.sliding_window is not None:
        num_full = jnp.int32(0)  # the window's first tile needs the mask
    return walk, div(start, g.block_k), num_full, cdiv(end, g.block_k)


def _decode_kernel(*kernel_refs, geometry: Geometry, scoring: Scoring, splits: Splits, out_in: bool):
    """Program (c, k): segment c // num_seqs of row c % num_seqs, kv head k -> the row's output
    when it has one segment, else the segment's partials at slot c. With `out_in`, the output
    is the aliased input before the outputs (the prefill launch's), written in place."""
    if out_in:
        kernel_refs = (*kernel_refs[:-5], *kernel_refs[-4:])
    refs = _Refs(*kernel_refs)
    program, kv_head = pl.program_id(0), pl.program_id(1)
    num_seqs = refs.num_seqs[0]
    num_rows = jnp.maximum(num_seqs, 1)
    split = div(program, num_rows)
    row = jnp.minimum(rem(program, num_rows), refs.seq_lens.shape[0] - 1)
    q_start = refs.query_start_loc[row]
    seq_len = refs.seq_lens[row]
    num_splits = splits.row_splits(seq_len, splits.max_splits(num_seqs))
    is_active = (row < num_seqs) & (split < num_splits)
    is_active &= refs.query_start_loc[row + 1] - q_start == 1

    @pl.when(is_active)
    def _():
        g_vec, is_head = head_rows(geometry, geometry.block_m)
        heads = kv_head * geometry.group + g_vec
        dims = jnp.arange(geometry.head_dim, dtype=jnp.int32)[None, :]
        q_index = (q_start, heads[:, None], dims)
        q_mask = full_mask(is_head, geometry.head_dim)
        walk_args = dict(
            kv_ref=refs.kv,
            block_tables_ref=refs.block_tables,
            row=row,
            kv_head=kv_head,
            q=plgpu.load(refs.q.at[q_index], mask=q_mask, other=0).astype(compute_dtype(refs.q.dtype, refs.kv.dtype)),
            geometry=geometry,
            scoring=scoring,
            kv_scales=load_kv_scales(refs.kv, refs.kv_scales),
            sinks=load_sinks(refs.sinks, heads, is_head),
        )
        walk, first, num_full, end = _decode_segment(seq_len, split, num_splits, splits, walk_args)
        m, l, acc = walk_tiles(walk, first, num_full, end)

        @pl.when(num_splits == 1)
        def _():
            out = normalize(l, acc).astype(refs.out.dtype)
            plgpu.store(refs.out.at[q_index], out, mask=q_mask)

        @pl.when(num_splits > 1)
        def _():
            plgpu.store(refs.acc.at[program, kv_head, g_vec[:, None], dims], acc, mask=q_mask)
            plgpu.store(refs.m.at[program, kv_head, g_vec], m, mask=is_head)
            plgpu.store(refs.l.at[program, kv_head, g_vec], l, mask=is_head)


@dataclasses.dataclass(frozen=True)
class _Refs:
    """The refs of a launch: the decode launch's, and the merge + prefill launch's but for
    its aliased output input."""

    query_start_loc: object  # [R + 1]
    seq_lens: object  # [R]
    block_tables: object  # [R, W]
    num_seqs: object  # [1]
    q: object  # [T, N, H]
    kv: object  # [2, K, P, S, H]
    kv_scales: object  # [2] float32: k_scale, v_scale
    sinks: object  # [N] float32, or None
    acc: object  # [C, K, G, H] float32 partials of the decode launch
    m: object  # [C, K, G]
    l: object  # [C, K, G]
    out: object  # [T, N, H]


def _merge_row(row: Array, kv_head: Array, refs: _Refs, geometry: Geometry, splits: Splits):
    """Folds the segment partials of split decode row `row` in log-sum-exp form and writes its
    output; any other row (one segment, several query tokens, padding) exits at once."""
    num_seqs = refs.num_seqs[0]
    q_start = refs.query_start_loc[row]
    num_splits = splits.row_splits(refs.seq_lens[row], splits.max_splits(num_seqs))
    is_active = (row < num_seqs) & (num_splits > 1)
    is_active &= refs.query_start_loc[row + 1] - q_start == 1

    @pl.when(is_active)
    def _():
        split_vec = jnp.arange(pl.next_power_of_2(splits.max_kv_splits), dtype=jnp.int32)
        segments = (split_vec * num_seqs + row, split_vec < num_splits)
        # Every load of a chunk in flight together; chunks of heads bound its registers.
        num_heads = pl.next_power_of_2(geometry.group)
        chunk = max(1, min(num_heads, _MERGE_TILE // (split_vec.shape[0] * geometry.head_dim)))
        for first_head in range(0, geometry.group, chunk):
            heads = first_head + jnp.arange(chunk, dtype=jnp.int32)
            _merge_heads(heads, segments, q_start, kv_head, refs, geometry)


def _merge_heads(heads: Array, segments: tuple, q_start: Array, kv_head: Array, refs: _Refs, g: Geometry):
    """Folds query heads `heads` (of kv head `kv_head`) over the segments (slots, is_split)."""
    slots, is_split = segments
    is_head = heads < g.group
    mask = is_split[:, None] & is_head[None, :]  # [splits, heads]
    m = plgpu.load(refs.m.at[slots[:, None], kv_head, heads[None, :]], mask=mask, other=MASK_VALUE)
    l = plgpu.load(refs.l.at[slots[:, None], kv_head, heads[None, :]], mask=mask, other=0.0)
    weights = jnp.exp2(m - jnp.max(m, axis=0)[None, :])
    dims = jnp.arange(g.head_dim, dtype=jnp.int32)
    index = (slots[:, None, None], kv_head, heads[None, :, None], dims[None, None, :])
    acc = plgpu.load(refs.acc.at[index], mask=mask[:, :, None], other=0.0)
    acc = jnp.sum(acc * weights[:, :, None], axis=0)
    out = normalize(jnp.sum(l * weights, axis=0), acc).astype(refs.out.dtype)
    index = (q_start, kv_head * g.group + heads[:, None], dims[None, :])
    plgpu.store(refs.out.at[index], out, mask=full_mask(is_head, g.head_dim))


@dataclasses.dataclass(frozen=True)
class QueryBlock:
    """Query tokens [first_token, first_token + block_q) of a row whose tokens are [start, end)."""

    row: Array
    start: Array
    end: Array
    first_token: Array


def find_query_block(
    query_start_loc, num_seqs_ref, num_tokens: int, block: Array, block_q: int, prefill_rows: bool = True
) -> tuple[QueryBlock, Array]:
    """Query block `block` of the step and whether it exists. The blocks are those of the rows
    with more than one query token (unless `prefill_rows` is False), in row order, then those
    of the padding tokens (as row num_seqs, tokens [query_start_loc[num_seqs], T)). Two vector
    loads of `query_start_loc`
    (issued together) and a prefix sum of the rows' block counts place it: no chain of
    dependent loads, so a program with no block exits after one round trip to memory."""
    num_rows = query_start_loc.shape[0] - 1
    num_seqs = num_seqs_ref[0]
    r = jnp.arange(pl.next_power_of_2(num_rows + 1), dtype=jnp.int32)
    lo = plgpu.load(query_start_loc.at[jnp.minimum(r, num_rows)])
    hi = plgpu.load(query_start_loc.at[jnp.minimum(r + 1, num_rows)])
    hi = jnp.where(r == num_seqs, num_tokens, hi)
    q_len = hi - lo
    has_blocks = jnp.where(r < num_seqs, (q_len > 1) & prefill_rows, (r == num_seqs) & (q_len > 0))
    num_blocks = jnp.where(has_blocks, cdiv(q_len, block_q), 0)
    ends = jax.lax.cumsum(num_blocks, axis=0)
    row = jnp.sum((ends <= block).astype(jnp.int32))

    def pick(x: Array) -> Array:
        return jnp.sum(jnp.where(r == row, x, 0))

    start = pick(lo)
    first_token = start + (block - pick(ends - num_blocks)) * block_q
    return QueryBlock(row, start, pick(hi), first_token), block < jnp.sum(num_blocks)


def _block_index(qb: QueryBlock, kv_head: Array, g: Geometry) -> tuple:
    """The [M, H] index of a query block's (token, head) rows in [T, N, H], and its mask."""
    m_vec = jnp.arange(g.block_m, dtype=jnp.int32)
    tokens = qb.first_token + div(m_vec, g.group)
    heads = kv_head * g.group + rem(m_vec, g.group)
    is_row = (m_vec < g.block_q * g.group) & (tokens < qb.end)
    dims = jnp.arange(g.head_dim, dtype=jnp.int32)[None, :]
    return (tokens[:, None], heads[:, None], dims), full_mask(is_row, g.head_dim)


def _prefill_block(qb: QueryBlock, kv_head: Array, refs: _Refs, g: Geometry, scoring: Scoring):
    """Attends one query block of a row with several query tokens and writes its output."""
    index, mask = _block_index(qb, kv_head, g)
    q = plgpu.load(refs.q.at[index], mask=mask, other=0).astype(compute_dtype(refs.q.dtype, refs.kv.dtype))
    seq_len = refs.seq_lens[qb.row]
    first_pos = seq_len - (qb.end - qb.start) + (qb.first_token - qb.start)
    last_pos = jnp.minimum(first_pos + g.block_q - 1, seq_len - 1)
    m_vec = jnp.arange(g.block_m, dtype=jnp.int32)
    walk = Walk(
        kv_ref=refs.kv,
        block_tables_ref=refs.block_tables,
        row=qb.row,
        kv_head=kv_head,
        q=q,
        positions=first_pos + div(m_vec, g.group),
        kv_end=seq_len,
        geometry=g,
        scoring=scoring,
        kv_scales=load_kv_scales(refs.kv, refs.kv_scales),
        sinks=load_sinks(refs.sinks, kv_head * g.group + rem(m_vec, g.group), m_vec < g.block_q * g.group),
    )
    end_tile = cdiv(last_pos + 1, g.block_k)
    if scoring.sliding_window is None:
        first_tile, num_full = jnp.int32(0), div(first_pos + 1, g.block_k)
    else:
        first_tile = div(jnp.maximum(first_pos - scoring.sliding_window + 1, 0), g.block_k)
        num_full = jnp.int32(0)
    _, l, acc = walk_tiles(walk, first_tile, num_full, end_tile)
    plgpu.store(refs.out.at[index], normalize(l, acc).astype(refs.out.dtype), mask=mask)


def _merge_prefill_kernel(
    *kernel_refs,
    prefill: Geometry,
    decode: Geometry,
    scoring: Scoring,
    splits: Splits,
    num_blocks: int,
    prefill_rows: bool,
):
    """Program (p, k), kv head k: query block num_blocks - 1 - p (the last blocks first) for
    p < num_blocks, else the merge of decode row p - num_blocks. Without `prefill_rows`, the
    blocks are the padding tokens' only (the Mosaic GPU launch wrote the prefill rows)."""
    *inputs, _out_in_ref, out_ref = kernel_refs
    refs = _Refs(*inputs, out_ref)
    program, kv_head = pl.program_id(0), pl.program_id(1)
    # In a decode-only step the only blocks are the padding row's: the programs past them
    # exit on two scalar loads instead of placing their block.
    real_tokens = refs.query_start_loc[refs.num_seqs[0]]
    padding_blocks = cdiv(refs.q.shape[0] - real_tokens, prefill.block_q)
    is_past = (real_tokens == refs.num_seqs[0]) & (num_blocks - 1 - program >= padding_blocks)

    @pl.when((program < num_blocks) & ~is_past)
    def _():
        block = num_blocks - 1 - program
        qb, is_block = find_query_block(
            refs.query_start_loc, refs.num_seqs, refs.q.shape[0], block, prefill.block_q, prefill_rows=prefill_rows
        )
        is_padding = qb.row == refs.num_seqs[0]

        @pl.when(is_block & is_padding)
        def _():
            index, mask = _block_index(qb, kv_head, prefill)
            zeros = jnp.zeros((prefill.block_m, prefill.head_dim), refs.out.dtype)
            plgpu.store(refs.out.at[index], zeros, mask=mask)

        @pl.when(is_block & ~is_padding)
        def _():
            _prefill_block(qb, kv_head, refs, prefill, scoring)

    @pl.when(program >= num_blocks)
    def _():
        _merge_row(program - num_blocks, kv_head, refs, decode, splits)


@dataclasses.dataclass(frozen=True)
class _Step:
    """The arrays and static settings that every launch of one call shares."""

    q: Array  # [T, N, H]
    kv_cache: Array  # [2, K, P, S, H]
    kv_scales: Array  # [2] float32
    sinks: Array | None  # [N] float32, or None
    query_start_loc: Array  # [R + 1]
    seq_lens: Array  # [R]
    block_tables: Array  # [R, W]
    num_seqs: Array  # [1]
    scoring: Scoring
    interpret: bool

    @property
    def max_rows(self) -> int:
        """Real rows at most: min(R, T), as every real row has a query token."""
        return min(self.seq_lens.shape[0], self.q.shape[0])

    @property
    def inputs(self) -> tuple[Array | None, ...]:
        """The inputs every launch reads: the metadata, q, the cache, its scales and the sinks."""
        metadata = (self.query_start_loc, self.seq_lens, self.block_tables, self.num_seqs)
        return (*metadata, self.q, self.kv_cache, self.kv_scales, self.sinks)

    def launch(self, kernel, grid, out_shape, tuning: KernelTuning, aliases=None):
        return pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=grid,
            input_output_aliases=aliases or {},
            interpret=self.interpret,
            compiler_params=plgpu.CompilerParams(num_warps=tuning.num_warps, num_stages=tuning.num_stages),
            name=kernel.func.__name__.strip("_"),
        )


def _check_shapes(q: Array, kv_cache: Array, sinks: Array | None) -> None:
    _, num_heads, head_dim = q.shape
    _, num_kv_heads, num_pages, page_size, cache_head_dim = kv_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"kv_cache head_dim must equal q's ({head_dim}), got {cache_head_dim}.")
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 (pad it), got {head_dim}.")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}).")
    if 2 * num_kv_heads * num_pages * page_size >= 2**31:
        raise ValueError(f"kv_cache has too many pages ({num_pages}) for int32 row indices.")
    if sinks is not None and sinks.shape != (num_heads,):
        raise ValueError(f"sinks must have shape ({num_heads},) (one per query head), got {sinks.shape}.")


# Jitted so a model's layers share one trace and lowering of the two launches.
@functools.partial(jax.jit, static_argnames=("scoring", "tuning", "mosaic_prefill", "interpret"))
def ragged_paged_attention(
    q: Float[Array, "T N H"],
    kv_cache: Float[Array, "2 K P S H"],
    query_start_loc: Int[Array, " R1"],
    seq_lens: Int[Array, " R"],
    block_tables: Int[Array, "R W"],
    num_seqs: Int[Array, "1"],
    kv_scales: Float[Array, "2"] | None = None,
    sinks: Float[Array, " N"] | None = None,
    *,
    scoring: Scoring,
    tuning: AttentionTuning | None = None,
    mosaic_prefill: MosaicPrefillTuning | None = None,
    interpret: bool = False,
) -> Float[Array, "T N H"]:
    """Attends every real query token to its row's keys; padding tokens get 0. `kv_scales`
    ([k_scale, v_scale], float32) apply to an fp8 cache only; None means 1.0. `sinks` (one
    logit per query head, None: none) join each head's softmax denominator. With
    `mosaic_prefill`, the rows of several query tokens run in the Mosaic GPU kernel
    (vjx/kernels/paged_prefill_mgpu.py) where `uses_mosaic_prefill` says it applies."""
    _check_shapes(q, kv_cache, sinks)
    _, num_heads, head_dim = q.shape
    _, num_kv_heads, _, page_size, _ = kv_cache.shape
    tuning = tuning or default_tuning(head_dim, compute_dtype(q.dtype, kv_cache.dtype))
    if kv_scales is None:
        kv_scales = jnp.asarray(np.ones((2,), np.float32))  # a constant: no device work
    if sinks is not None:
        sinks = sinks.astype(jnp.float32)
    step = _Step(q, kv_cache, kv_scales, sinks, query_start_loc, seq_lens, block_tables, num_seqs, scoring, interpret)
    group = num_heads // num_kv_heads
    decode = Geometry(
        num_kv_heads,
        group,
        head_dim,
        page_size,
        block_m=max(16, pl.next_power_of_2(group)),
        block_k=tuning.decode.block_k,
    )
    splits = Splits(
        tuning.decode_programs,
        tuning.max_kv_splits,
        tuning.min_tiles_per_split,
        decode.block_k,
        scoring.sliding_window,
    )
    out = None
    if mosaic_prefill is not None and uses_mosaic_prefill(q, kv_cache, scoring, sinks, mosaic_prefill):
        metadata = (query_start_loc, seq_lens, block_tables, num_seqs)
        out = paged_prefill_attention(
            q, kv_cache, *metadata, sm_scale=scoring.sm_scale, tuning=mosaic_prefill, interpret=interpret
        )
    buffers = _decode(step, decode, splits, tuning.decode, out)
    prefill = dataclasses.replace(
        decode,
        block_m=max(tuning.prefill.block_m, pl.next_power_of_2(group)),
        block_k=tuning.prefill.block_k,
    )
    return _merge_prefill(step, (decode, prefill), splits, tuning.prefill, buffers, prefill_rows=out is None)


def uses_mosaic_prefill(
    q: Array, kv_cache: Array, scoring: Scoring, sinks: Array | None, tuning: MosaicPrefillTuning
) -> bool:
    """Whether a step runs its prefill rows in the Mosaic GPU kernel: plain causal scoring (no
    sliding window, soft cap or sinks) and shapes the kernel takes (`mosaic_supports`: 16-bit
    q and cache, head dim 64 or 128, at least one query block of tokens, a multiple of 8)."""
    plain = scoring.sliding_window is None and scoring.soft_cap is None and sinks is None
    return plain and mosaic_supports(q, kv_cache, tuning)


def _decode(step: _Step, g: Geometry, splits: Splits, tuning: KernelTuning, out: Array | None) -> tuple:
    """Launch 1: float32 partials [C, K, G, H] (acc), [C, K, G] (max, sum) of the split rows'
    segments, and the output [T, N, H] with the rows of one segment written (into `out` in
    place when given)."""
    num_rows = step.max_rows
    num_programs = max(num_rows, min(num_rows * splits.max_kv_splits, splits.decode_programs))
    shape = (num_programs, g.num_kv_heads, g.group)
    out_shape = (
        jax.ShapeDtypeStruct((*shape, g.head_dim), jnp.float32),
        jax.ShapeDtypeStruct(shape, jnp.float32),
        jax.ShapeDtypeStruct(shape, jnp.float32),
        jax.ShapeDtypeStruct(step.q.shape, step.q.dtype),
    )
    kernel = functools.partial(_decode_kernel, geometry=g, scoring=step.scoring, splits=splits, out_in=out is not None)
    inputs, aliases = step.inputs, None
    if out is not None:
        inputs = (*inputs, out)
        aliases = {len(jax.tree.leaves(inputs)) - 1: 3}
    return step.launch(kernel, (num_programs, g.num_kv_heads), out_shape, tuning, aliases)(*inputs)


def _merge_prefill(
    step: _Step, geometries: tuple, splits: Splits, tuning: KernelTuning, buffers: tuple, prefill_rows: bool
) -> Array:
    """Launch 2: the prefill rows (unless `prefill_rows` is False: the Mosaic GPU launch wrote
    them), the split decode rows and the padding tokens, written into the decode launch's
    output in place."""
    decode, prefill = geometries
    num_tokens = step.q.shape[0]
    # The rows with blocks: those of several tokens (min(R, T // 2) at most) and the padding
    # row. n such rows, T tokens in all, fill at most (T - n) // block_q + n blocks, a bound
    # that grows with n.
    num_rows = min(min(step.seq_lens.shape[0], num_tokens // 2) + 1, num_tokens) if prefill_rows else 1
    num_blocks = (num_tokens - num_rows) // prefill.block_q + num_rows
    # Rows are split only when num_seqs <= decode_programs // 2.
    num_merge_rows = min(step.max_rows, splits.decode_programs // 2) if splits.max_kv_splits > 1 else 0
    kernel = functools.partial(
        _merge_prefill_kernel,
        prefill=prefill,
        decode=decode,
        scoring=step.scoring,
        splits=splits,
        num_blocks=num_blocks,
        prefill_rows=prefill_rows,
    )
    inputs = (*step.inputs, *buffers)
    launch = step.launch(
        kernel,
        (num_blocks + num_merge_rows, prefill.num_kv_heads),
        jax.ShapeDtypeStruct(step.q.shape, step.q.dtype),
        tuning,
        # The output is written into the last input, the decode launch's (None sinks are no input).
        aliases={len(jax.tree.leaves(inputs)) - 1: 0},
    )
    return launch(*inputs)
