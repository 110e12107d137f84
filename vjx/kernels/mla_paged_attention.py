"""Paged multi-head latent attention (DeepSeek-V2/V3, absorbed form) on GPUs in Pallas (Triton lowering).

Legend: T tokens, R request rows, N query heads, Lr the latent rank (`kv_lora_rank`), Lp the
rotary width (`qk_rope_head_dim`), Lk = Lr + Lp, P pages, S page size, W block-table width,
E query heads of a program, M matmul rows of a program, L keys of one tile, C decode programs
per head group.

The cache of one layer is `[P, S, Lk]` (vjx/attention/mla.py): one latent per token, shared by
every query head, so attention is multi-query with keys = whole latents and values = their
first Lr dims. A program packs E query heads (times a few query tokens in prefill) into the M
rows of its matmuls and walks its row's keys in tiles of L: it gathers each tile once, as two
power-of-two loads (the [L, Lr] compressed part and the [L, Lp] rotary part), takes the
scores as q_nope . k_nope + q_rope . k_rope and reuses the [L, Lr] part as the tile's values,
so every tile is read once per E heads, not once per head.

The launches mirror ragged_paged_attention.py (whose split policy they reuse):
1. decode: rows with one query token, program (c, e) = segment c // num_seqs of row
   c % num_seqs for head group e. A row's keys are cut into at most `max_kv_splits` segments,
   chosen on the device; a row of one segment writes its output, the segments of a split row
   write float32 partials (acc, max, sum) at slot c.
2. merge + prefill: query blocks of rows with several query tokens (last blocks first), the
   padding tokens as one more row whose blocks write zeros, then the log-sum-exp merge of the
   split decode rows, into the decode launch's output in place.
The softmax is online, in float32, in base 2 (log2(e) folded into the scale); causal and
end-aligned; tiles past a block's causal frontier are skipped and tiles wholly before it run
without masks. An fp8 cache (stored unscaled, as mla.py writes it) is converted to the
query's dtype as each tile is loaded.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float

from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.kv_quant import compute_dtype
from vjx.kernels.kv_walk import MASK_VALUE, cdiv, div, dot, full_mask, normalize, rem
from vjx.kernels.ragged_paged_attention import QueryBlock, Splits, find_query_block

_LOG2E = math.log2(math.e)
# Elements of one merge tile [splits, heads, Lr] (a few registers a thread).
_MERGE_TILE = 8192


def _is_power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


@dataclasses.dataclass(frozen=True)
class MlaLaunch:
    """Tile shape and Triton schedule of one launch."""

    heads: int = 16
    """E: query heads per program (they share every key tile; a power of two)."""
    tokens: int = 1
    """Query tokens per program (prefill; decode programs take one): M = tokens x E rows,
    padded to 16."""
    block_k: int = 32
    """L: keys per tile (a power of two >= 16)."""
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("heads", "tokens", "block_k"):
            value = getattr(self, name)
            if not _is_power_of_two(value):
                raise ValueError(f"{name} must be a power of two, got {value}.")
        if self.block_k < 16:
            raise ValueError(f"block_k must be a power of two >= 16, got {self.block_k}.")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}.")
        if not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages must be in [1, 6], got {self.num_stages}.")


@dataclasses.dataclass(frozen=True)
class MlaTuning:
    """Knobs of the decode launch, the merge + prefill launch and the split-KV policy. The
    defaults are starting points (16 heads x 32 keys per decode tile, 4 warps, as vLLM's
    Triton MLA decode uses), to be swept on the device."""

    decode: MlaLaunch = MlaLaunch(heads=16, tokens=1, block_k=32, num_warps=4, num_stages=2)
    prefill: MlaLaunch = MlaLaunch(heads=16, tokens=4, block_k=32, num_warps=8, num_stages=2)
    decode_programs: int = 32
    """Target decode programs per head group: a step of B rows splits each decode row into
    at most min(max_kv_splits, decode_programs // B) segments (computed on the device)."""
    max_kv_splits: int = 16
    min_tiles_per_split: int = 4
    """Key tiles per segment at least, so a short row is not split."""

    def __post_init__(self):
        for name in ("decode_programs", "max_kv_splits", "min_tiles_per_split"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Static shapes of one launch."""

    rank: int  # Lr
    rope_dim: int  # Lp
    page_size: int  # S
    heads: int  # E
    block_q: int  # query tokens per program
    block_k: int  # L

    @property
    def block_m(self) -> int:
        return max(16, pl.next_power_of_2(self.heads * self.block_q))

    @property
    def num_rows(self) -> int:
        """Real matmul rows: block_q tokens x E heads (the rest of M is padding)."""
        return self.heads * self.block_q


@dataclasses.dataclass(frozen=True)
class _Walk:
    """What one program's key walk needs: its refs, its query tile and its keys' bound."""

    kv_ref: object
    block_tables_ref: object
    row: Array
    q: tuple[Array, Array]  # [M, Lr] and [M, Lp], in the compute dtype
    positions: Array  # [M]: each query row's position in its sequence
    kv_end: Array  # keys at or past this index are not read
    geometry: _Geometry
    scale: float  # sm_scale * log2(e)


def _load_latents(walk: _Walk, keys: Array, key_mask: Array | None) -> tuple[Array, Array]:
    """The [L, Lr] compressed and [L, Lp] rotary parts of the latents at `keys`, gathered
    through the block table, in the compute dtype."""
    g = walk.geometry
    pages_ref = walk.block_tables_ref.at[walk.row, div(keys, g.page_size)]
    if key_mask is None:
        page_ids = plgpu.load(pages_ref)
    else:
        page_ids = plgpu.load(pages_ref, mask=key_mask, other=0)
    slots = (page_ids[:, None], rem(keys, g.page_size)[:, None])
    parts = []
    for first, width in ((0, g.rank), (g.rank, g.rope_dim)):
        index = (*slots, first + jnp.arange(width, dtype=jnp.int32)[None, :])
        if key_mask is None:
            part = plgpu.load(walk.kv_ref.at[index])
        else:
            # A float `other`: Triton's lowering casts no integer constant to float8.
            part = plgpu.load(walk.kv_ref.at[index], mask=full_mask(key_mask, width), other=0.0)
        parts.append(part.astype(walk.q[0].dtype))
    return parts[0], parts[1]


def _tile_step(tile: Array, carry: tuple, walk: _Walk, is_masked: bool) -> tuple:
    """Folds key tile `tile` into the running max m, sum l and output acc (float32)."""
    m, l, acc = carry
    block_k = walk.geometry.block_k
    keys = tile * block_k + jnp.arange(block_k, dtype=jnp.int32)
    key_mask = keys < walk.kv_end if is_masked else None
    k_nope, k_rope = _load_latents(walk, keys, key_mask)
    q_nope, q_rope = walk.q
    s = (dot(q_nope, k_nope, contract_b=1) + dot(q_rope, k_rope, contract_b=1)) * walk.scale
    if is_masked:
        is_visible = key_mask[None, :] & (keys[None, :] <= walk.positions[:, None])
        s = jnp.where(is_visible, s, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.exp2(s - m_new[:, None])
    if is_masked:
        p = jnp.where(is_visible, p, 0.0)
    alpha = jnp.exp2(m - m_new)
    # The values are the compressed part of the keys: the tile already loaded.
    acc = acc * alpha[:, None] + dot(p.astype(k_nope.dtype), k_nope, contract_b=0)
    return m_new, l * alpha + jnp.sum(p, axis=1), acc


def _walk_tiles(walk: _Walk, first_tile: Array, num_full: Array, end_tile: Array) -> tuple:
    """Tiles [first_tile, first_tile + num_full) unmasked, then masked up to end_tile -> the
    running max m, sum l and output acc (float32)."""
    g = walk.geometry
    m = jnp.full((g.block_m,), MASK_VALUE, jnp.float32)
    carry = (m, jnp.zeros((g.block_m,), jnp.float32), jnp.zeros((g.block_m, g.rank), jnp.float32))
    full_end = first_tile + num_full
    step = functools.partial(_tile_step, walk=walk, is_masked=False)
    carry = jax.lax.fori_loop(first_tile, full_end, step, carry)
    step = functools.partial(_tile_step, walk=walk, is_masked=True)
    return jax.lax.fori_loop(full_end, jnp.maximum(end_tile, full_end), step, carry)


@dataclasses.dataclass(frozen=True)
class _Refs:
    """The refs of a launch: the decode launch's, and the merge + prefill launch's but for
    its aliased output input."""

    query_start_loc: object  # [R + 1]
    seq_lens: object  # [R]
    block_tables: object  # [R, W]
    num_seqs: object  # [1]
    q: object  # [T, N, Lk]
    kv: object  # [P, S, Lk]
    acc: object  # [C, N, Lr] float32 partials of the decode launch
    m: object  # [C, N]
    l: object  # [C, N]
    out: object  # [T, N, Lr]


def _load_q(refs: _Refs, tokens: Array, heads: Array, is_row: Array, g: _Geometry) -> tuple[Array, Array]:
    """The [M, Lr] and [M, Lp] query parts of rows (tokens, heads), 0 where not `is_row`."""
    dtype = compute_dtype(refs.q.dtype, refs.kv.dtype)
    parts = []
    for first, width in ((0, g.rank), (g.rank, g.rope_dim)):
        index = (tokens[:, None], heads[:, None], first + jnp.arange(width, dtype=jnp.int32)[None, :])
        parts.append(plgpu.load(refs.q.at[index], mask=full_mask(is_row, width), other=0).astype(dtype))
    return parts[0], parts[1]


def _out_index(tokens: Array, heads: Array, g: _Geometry) -> tuple:
    return tokens[:, None], heads[:, None], jnp.arange(g.rank, dtype=jnp.int32)[None, :]


def _decode_segment(seq_len: Array, split: Array, num_splits: Array, g: _Geometry) -> tuple:
    """Segment `split` of a decode row: its end key, first tile, unmasked tiles and end tile."""
    per_split = cdiv(cdiv(seq_len, num_splits), g.block_k) * g.block_k
    start = split * per_split
    end = jnp.minimum(start + per_split, seq_len)
    return end, div(start, g.block_k), div(jnp.maximum(end - start, 0), g.block_k), cdiv(end, g.block_k)


def _decode_kernel(*kernel_refs, geometry: _Geometry, scale: float, splits: Splits):
    """Program (c, e): segment c // num_seqs of row c % num_seqs, head group e -> the row's
    output when it has one segment, else the segment's partials at slot c."""
    refs, g = _Refs(*kernel_refs), geometry
    program, head_group = pl.program_id(0), pl.program_id(1)
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
        m_vec = jnp.arange(g.block_m, dtype=jnp.int32)
        heads, is_head = head_group * g.heads + m_vec, m_vec < g.heads
        tokens = jnp.full((g.block_m,), q_start, jnp.int32)
        end, first, num_full, end_tile = _decode_segment(seq_len, split, num_splits, g)
        positions = jnp.full((g.block_m,), seq_len - 1, jnp.int32)
        q = _load_q(refs, tokens, heads, is_head, g)
        walk = _Walk(refs.kv, refs.block_tables, row, q, positions, end, g, scale)
        m, l, acc = _walk_tiles(walk, first, num_full, end_tile)
        mask = full_mask(is_head, g.rank)

        @pl.when(num_splits == 1)
        def _():
            plgpu.store(refs.out.at[_out_index(tokens, heads, g)], normalize(l, acc).astype(refs.out.dtype), mask=mask)

        @pl.when(num_splits > 1)
        def _():
            slots = jnp.full((g.block_m,), program, jnp.int32)
            plgpu.store(refs.acc.at[_out_index(slots, heads, g)], acc, mask=mask)
            plgpu.store(refs.m.at[program, heads], m, mask=is_head)
            plgpu.store(refs.l.at[program, heads], l, mask=is_head)


def _merge_row(row: Array, head_group: Array, refs: _Refs, g: _Geometry, splits: Splits):
    """Folds the segment partials of split decode row `row` for the E heads of `head_group` in
    log-sum-exp form and writes its output; any other row exits at once."""
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
        chunk = max(1, min(g.heads, _MERGE_TILE // (split_vec.shape[0] * g.rank)))

        def merge_chunk(i, carry):
            heads = head_group * g.heads + i * chunk + jnp.arange(chunk, dtype=jnp.int32)
            _merge_heads(heads, segments, q_start, refs, g)
            return carry

        jax.lax.fori_loop(0, g.heads // chunk, merge_chunk, 0)


def _merge_heads(heads: Array, segments: tuple, q_start: Array, refs: _Refs, g: _Geometry):
    """Folds query heads `heads` over the segments (slots, is_split) and writes their output."""
    slots, is_split = segments
    mask = jnp.broadcast_to(is_split[:, None], (slots.shape[0], heads.shape[0]))  # [splits, heads]
    m = plgpu.load(refs.m.at[slots[:, None], heads[None, :]], mask=mask, other=MASK_VALUE)
    l = plgpu.load(refs.l.at[slots[:, None], heads[None, :]], mask=mask, other=0.0)
    weights = jnp.exp2(m - jnp.max(m, axis=0)[None, :])
    dims = jnp.arange(g.rank, dtype=jnp.int32)
    index = (slots[:, None, None], heads[None, :, None], dims[None, None, :])
    acc = plgpu.load(refs.acc.at[index], mask=mask[:, :, None], other=0.0)
    acc = jnp.sum(acc * weights[:, :, None], axis=0)
    out = normalize(jnp.sum(l * weights, axis=0), acc).astype(refs.out.dtype)
    plgpu.store(refs.out.at[q_start, heads[:, None], dims[None, :]], out)


def _block_rows(qb: QueryBlock, head_group: Array, g: _Geometry) -> tuple[Array, Array, Array]:
    """The (token, head) of each of a query block's M rows, and which rows are real."""
    m_vec = jnp.arange(g.block_m, dtype=jnp.int32)
    tokens = qb.first_token + div(m_vec, g.heads)
    heads = head_group * g.heads + rem(m_vec, g.heads)
    return tokens, heads, (m_vec < g.num_rows) & (tokens < qb.end)


def _prefill_block(qb: QueryBlock, head_group: Array, refs: _Refs, g: _Geometry, scale: float):
    """Attends one query block of a row with several query tokens and writes its output."""
    tokens, heads, is_row = _block_rows(qb, head_group, g)
    seq_len = refs.seq_lens[qb.row]
    first_pos = seq_len - (qb.end - qb.start) + (qb.first_token - qb.start)
    last_pos = jnp.minimum(first_pos + g.block_q - 1, seq_len - 1)
    positions = first_pos + div(jnp.arange(g.block_m, dtype=jnp.int32), g.heads)
    q = _load_q(refs, tokens, heads, is_row, g)
    walk = _Walk(refs.kv, refs.block_tables, qb.row, q, positions, seq_len, g, scale)
    num_full = div(first_pos + 1, g.block_k)
    _, l, acc = _walk_tiles(walk, jnp.int32(0), num_full, cdiv(last_pos + 1, g.block_k))
    out = normalize(l, acc).astype(refs.out.dtype)
    plgpu.store(refs.out.at[_out_index(tokens, heads, g)], out, mask=full_mask(is_row, g.rank))


def _merge_prefill_kernel(*kernel_refs, prefill: _Geometry, scale: float, splits: Splits, num_blocks: int):
    """Program (p, e), head group e: query block num_blocks - 1 - p (the last blocks first)
    for p < num_blocks, else the merge of decode row p - num_blocks."""
    *inputs, _out_in_ref, out_ref = kernel_refs
    refs = _Refs(*inputs, out_ref)
    program, head_group = pl.program_id(0), pl.program_id(1)
    # In a decode-only step the only blocks are the padding row's: the programs past them
    # exit on two scalar loads instead of placing their block.
    real_tokens = refs.query_start_loc[refs.num_seqs[0]]
    padding_blocks = cdiv(refs.q.shape[0] - real_tokens, prefill.block_q)
    is_past = (real_tokens == refs.num_seqs[0]) & (num_blocks - 1 - program >= padding_blocks)

    @pl.when((program < num_blocks) & ~is_past)
    def _():
        block = num_blocks - 1 - program
        qb, is_block = find_query_block(refs.query_start_loc, refs.num_seqs, refs.q.shape[0], block, prefill.block_q)
        is_padding = qb.row == refs.num_seqs[0]

        @pl.when(is_block & is_padding)
        def _():
            tokens, heads, is_row = _block_rows(qb, head_group, prefill)
            zeros = jnp.zeros((prefill.block_m, prefill.rank), refs.out.dtype)
            plgpu.store(refs.out.at[_out_index(tokens, heads, prefill)], zeros, mask=full_mask(is_row, prefill.rank))

        @pl.when(is_block & ~is_padding)
        def _():
            _prefill_block(qb, head_group, refs, prefill, scale)

    @pl.when(program >= num_blocks)
    def _():
        _merge_row(program - num_blocks, head_group, refs, prefill, splits)


@dataclasses.dataclass(frozen=True)
class _Step:
    """The arrays and static settings that both launches of one call share."""

    q: Array  # [T, N, Lk]
    kv_cache: Array  # [P, S, Lk]
    md: AttentionMetadata
    scale: float
    interpret: bool

    @property
    def max_rows(self) -> int:
        """Real rows at most: min(R, T), as every real row has a query token."""
        return min(self.md.seq_lens.shape[0], self.q.shape[0])

    @property
    def inputs(self) -> tuple[Array, ...]:
        md = self.md
        return (md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs, self.q, self.kv_cache)

    def launch(self, kernel, grid, out_shape, launch: MlaLaunch, aliases=None):
        return pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=grid,
            input_output_aliases=aliases or {},
            interpret=self.interpret,
            compiler_params=plgpu.CompilerParams(num_warps=launch.num_warps, num_stages=launch.num_stages),
            name=f"mla_{kernel.func.__name__.strip('_')}",
        )


def _check_shapes(q_latent: Array, kv_cache: Array, kv_lora_rank: int, tuning: MlaTuning) -> None:
    _, num_heads, latent_dim = q_latent.shape
    num_pages, page_size, cache_dim = kv_cache.shape
    if cache_dim != latent_dim:
        raise ValueError(f"kv_cache's latent dim must equal q_latent's ({latent_dim}), got {cache_dim}.")
    rope_dim = latent_dim - kv_lora_rank
    for name, value in (("kv_lora_rank", kv_lora_rank), ("qk_rope_head_dim (latent dim - kv_lora_rank)", rope_dim)):
        if not _is_power_of_two(value) or value < 16:
            raise ValueError(f"{name} must be a power of two >= 16 (pad it), got {value}.")
    for name, launch in (("decode", tuning.decode), ("prefill", tuning.prefill)):
        if num_heads % min(launch.heads, num_heads):
            raise ValueError(f"tuning.{name}.heads ({launch.heads}) must divide num_heads ({num_heads}).")
    if num_pages * page_size >= 2**31:
        raise ValueError(f"kv_cache has too many pages ({num_pages}) for int32 slot indices.")


# Jitted so a model's layers share one trace and lowering of the two launches.
@functools.partial(jax.jit, static_argnames=("sm_scale", "kv_lora_rank", "tuning", "interpret"))
def mla_paged_attention(
    q_latent: Float[Array, "T N Lk"],
    kv_cache: Float[Array, "P S Lk"],
    md: AttentionMetadata,
    *,
    sm_scale: float,
    kv_lora_rank: int,
    tuning: MlaTuning | None = None,
    interpret: bool = False,
) -> Float[Array, "T N Lr"]:
    """Attends every real query token to its row's latents (already written at
    `md.slot_mapping`): head n of token t gets softmax_j(q_latent[t, n] . latent_j * sm_scale)
    . latent_j[:kv_lora_rank] over the row's keys j it may see; padding tokens get 0. The
    output has q_latent's dtype."""
    tuning = tuning or MlaTuning()
    _check_shapes(q_latent, kv_cache, kv_lora_rank, tuning)
    num_heads, latent_dim = q_latent.shape[1:]
    step = _Step(q_latent, kv_cache, md, sm_scale * _LOG2E, interpret)

    def geometry(launch: MlaLaunch, block_q: int) -> _Geometry:
        heads = min(launch.heads, num_heads)
        return _Geometry(kv_lora_rank, latent_dim - kv_lora_rank, kv_cache.shape[1], heads, block_q, launch.block_k)

    decode = geometry(tuning.decode, 1)
    splits = Splits(tuning.decode_programs, tuning.max_kv_splits, tuning.min_tiles_per_split, decode.block_k, None)
    buffers = _decode(step, decode, splits, tuning.decode)
    return _merge_prefill(step, geometry(tuning.prefill, tuning.prefill.tokens), splits, tuning.prefill, buffers)


def _decode(step: _Step, g: _Geometry, splits: Splits, launch: MlaLaunch) -> tuple:
    """Launch 1: float32 partials [C, N, Lr] (acc), [C, N] (max, sum) of the split rows'
    segments, and the output [T, N, Lr] with the rows of one segment written."""
    num_tokens, num_heads, _ = step.q.shape
    num_rows = step.max_rows
    num_programs = max(num_rows, min(num_rows * splits.max_kv_splits, splits.decode_programs))
    shape = (num_programs, num_heads)
    out_shape = (
        jax.ShapeDtypeStruct((*shape, g.rank), jnp.float32),
        jax.ShapeDtypeStruct(shape, jnp.float32),
        jax.ShapeDtypeStruct(shape, jnp.float32),
        jax.ShapeDtypeStruct((num_tokens, num_heads, g.rank), step.q.dtype),
    )
    kernel = functools.partial(_decode_kernel, geometry=g, scale=step.scale, splits=splits)
    return step.launch(kernel, (num_programs, num_heads // g.heads), out_shape, launch)(*step.inputs)


def _merge_prefill(step: _Step, prefill: _Geometry, splits: Splits, launch: MlaLaunch, buffers: tuple) -> Array:
    """Launch 2: the prefill rows, the split decode rows and the padding tokens, written into
    the decode launch's output in place."""
    num_tokens, num_heads, _ = step.q.shape
    # As in ragged_paged_attention.py: n rows with blocks (those of several tokens and the
    # padding row), T tokens in all, fill at most (T - n) // block_q + n blocks.
    num_rows = min(min(step.md.seq_lens.shape[0], num_tokens // 2) + 1, num_tokens)
    num_blocks = (num_tokens - num_rows) // prefill.block_q + num_rows
    # Rows are split only when num_seqs <= decode_programs // 2.
    num_merge_rows = min(step.max_rows, splits.decode_programs // 2) if splits.max_kv_splits > 1 else 0
    kernel = functools.partial(
        _merge_prefill_kernel,
        prefill=prefill,
        scale=step.scale,
        splits=splits,
        num_blocks=num_blocks,
    )
    call = step.launch(
        kernel,
        (num_blocks + num_merge_rows, num_heads // prefill.heads),
        jax.ShapeDtypeStruct(buffers[-1].shape, step.q.dtype),
        launch,
        aliases={len(step.inputs) + len(buffers) - 1: 0},  # the output is the decode launch's
    )
    return call(*step.inputs, *buffers)
