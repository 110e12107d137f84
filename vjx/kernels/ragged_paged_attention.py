"""Ragged paged attention on GPUs in Pallas (Triton lowering): decode, prefill and mixed steps.

Legend: T tokens, R request rows, N query heads, K kv heads, G = N // K query heads per kv
head, H head dim, P pages, S page size, W block-table width, M matmul rows of a program,
L keys of one tile, C decode programs per kv head.

The cache of one layer is `[2, K, P, S, H]` (index 0 keys, 1 values): one kv head's page is
S * H contiguous elements, so a program that walks one kv head reads whole rows of H.

One call runs three launches:
1. decode: rows with one query token. Program (c, k) takes row c // splits and the key
   segment c % splits of it; `splits` is computed on the device from `num_seqs`, so few long
   rows still fill the GPU without a recompile. It writes float32 partials (acc, max, sum).
2. merge: one program per (row, kv head) folds its segments' partials in log-sum-exp form
   and writes the row's output.
3. prefill: every row with more than one query token, cut into blocks of M // G tokens.
   Program (b, k) finds its row by a binary search of `query_start_loc` (block b of the
   step belongs to row r when query_start_loc[r] // block_q + r <= b).
Every program packs the G query heads of its kv head into the M rows of its matmuls, so each
K/V tile is read once per kv head. Attention is causal, aligned to the end of each row; keys
are walked in tiles of L through the block table (a gather of each key's page), tiles past
the causal frontier or before the sliding window are skipped, and tiles wholly inside it run
without masks. The softmax is online, in float32, in base 2 (log2(e) folded into the scale).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

from vjx.kernels.tuning import AttentionTuning, KernelTuning, default_tuning

# Finite, so a fully masked row gives exp2(0) * 0 instead of inf - inf = NaN.
_MASK_VALUE = -1e30
_LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How raw q.k products become logits and which keys a query may see."""

    sm_scale: float
    sliding_window: int | None = None
    soft_cap: float | None = None

    def __post_init__(self):
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}.")
        if self.soft_cap is not None and self.soft_cap <= 0:
            raise ValueError(f"soft_cap must be > 0 or None, got {self.soft_cap}.")


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Static shapes of one launch."""

    num_kv_heads: int  # K
    group: int  # G
    head_dim: int  # H
    page_size: int  # S
    block_m: int  # M
    block_k: int  # L

    @property
    def block_q(self) -> int:
        """Query tokens per program (its M rows hold block_q tokens x G heads)."""
        return self.block_m // self.group


@dataclasses.dataclass(frozen=True)
class _Walk:
    """What one program's KV walk needs: its refs, its query tile and its keys' bound."""

    kv_ref: object
    block_tables_ref: object
    row: Array
    kv_head: Array
    q: Array  # [M, H]
    positions: Array  # [M]: each query row's position in its sequence
    kv_end: Array  # keys at or past this index are not read
    geometry: _Geometry
    scoring: Scoring


def _div(a: Array, b) -> Array:
    """a // b for a >= 0 and b > 0: truncating division, which lowers to one instruction
    (floor division adds sign fix-ups to every index computation)."""
    return jax.lax.div(a, jnp.asarray(b, a.dtype))


def _rem(a: Array, b) -> Array:
    """a % b for a >= 0 and b > 0."""
    return jax.lax.rem(a, jnp.asarray(b, a.dtype))


def _cdiv(a: Array, b) -> Array:
    """ceil(a / b) for a >= 0 and b > 0."""
    return _div(a + b - 1, b)


def _dot(a: Array, b: Array, *, contract_b: int) -> Array:
    """a @ b (contract_b=0) or a @ b.T (contract_b=1), float32 accumulation; float32
    inputs use full precision (Triton's default for them is tf32)."""
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    dims = (((1,), (contract_b,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _load_kv(walk: _Walk, which: int, keys: Array, key_mask: Array | None) -> Array:
    """The [L, H] keys (which=0) or values (which=1) at `keys`, gathered through the block table."""
    g = walk.geometry
    pages_ref = walk.block_tables_ref.at[walk.row, _div(keys, g.page_size)]
    dims = jnp.arange(g.head_dim, dtype=jnp.int32)[None, :]
    if key_mask is None:
        page_ids = plgpu.load(pages_ref)
    else:
        page_ids = plgpu.load(pages_ref, mask=key_mask, other=0)
    index = (which, walk.kv_head, page_ids[:, None], _rem(keys, g.page_size)[:, None], dims)
    if key_mask is None:
        return plgpu.load(walk.kv_ref.at[index])
    mask = jnp.broadcast_to(key_mask[:, None], (keys.shape[0], g.head_dim))
    return plgpu.load(walk.kv_ref.at[index], mask=mask, other=0)


def _scores(walk: _Walk, k: Array) -> Array:
    """Base-2 logits [M, L] of the query tile against one key tile."""
    s = _dot(walk.q, k, contract_b=1)
    scoring = walk.scoring
    if scoring.soft_cap is None:
        return s * (scoring.sm_scale * _LOG2E)
    cap = scoring.soft_cap
    return (cap * _LOG2E) * jnp.tanh(s * (scoring.sm_scale / cap))


def _visible(walk: _Walk, keys: Array) -> Array:
    """[M, L]: key inside the walk's bound, at or before the query, inside its window."""
    is_visible = (keys < walk.kv_end)[None, :] & (keys[None, :] <= walk.positions[:, None])
    window = walk.scoring.sliding_window
    if window is not None:
        is_visible &= keys[None, :] > walk.positions[:, None] - window
    return is_visible


def _tile_step(tile: Array, carry: tuple, walk: _Walk, is_masked: bool) -> tuple:
    """Folds key tile `tile` into the running max m, sum l and output acc (float32)."""
    m, l, acc = carry
    block_k = walk.geometry.block_k
    keys = tile * block_k + jnp.arange(block_k, dtype=jnp.int32)
    key_mask = keys < walk.kv_end if is_masked else None
    s = _scores(walk, _load_kv(walk, 0, keys, key_mask))
    if is_masked:
        is_visible = _visible(walk, keys)
        s = jnp.where(is_visible, s, _MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.exp2(s - m_new[:, None])
    if is_masked:
        p = jnp.where(is_visible, p, 0.0)
    alpha = jnp.exp2(m - m_new)
    v = _load_kv(walk, 1, keys, key_mask)
    acc = acc * alpha[:, None] + _dot(p.astype(v.dtype), v, contract_b=0)
    return m_new, l * alpha + jnp.sum(p, axis=1), acc


def _walk_tiles(walk: _Walk, first_tile: Array, num_full: Array, end_tile: Array) -> tuple:
    """Tiles [first_tile, first_tile + num_full) unmasked, then masked up to end_tile."""
    g = walk.geometry
    carry = (
        jnp.full((g.block_m,), _MASK_VALUE, jnp.float32),
        jnp.zeros((g.block_m,), jnp.float32),
        jnp.zeros((g.block_m, g.head_dim), jnp.float32),
    )
    full_end = first_tile + num_full
    step = functools.partial(_tile_step, walk=walk, is_masked=False)
    carry = jax.lax.fori_loop(first_tile, full_end, step, carry)
    step = functools.partial(_tile_step, walk=walk, is_masked=True)
    return jax.lax.fori_loop(full_end, jnp.maximum(end_tile, full_end), step, carry)


def _normalize(l: Array, acc: Array) -> Array:
    """acc / l, and 0 for rows that saw no key."""
    safe_l = jnp.where(l > 0.0, l, 1.0)
    return jnp.where((l > 0.0)[:, None], acc / safe_l[:, None], 0.0)


def _head_rows(geometry: _Geometry, num_rows: int) -> tuple[Array, Array]:
    """Row g of a decode tile is query head g of the kv head; rows >= G are padding."""
    g_vec = jnp.arange(num_rows, dtype=jnp.int32)
    return g_vec, g_vec < geometry.group


def _full_mask(row_mask: Array, head_dim: int) -> Array:
    return jnp.broadcast_to(row_mask[:, None], (row_mask.shape[0], head_dim))


def _decode_segment(seq_len: Array, split: Array, num_splits: Array, walk_args: dict) -> tuple:
    """The [start, end) keys of segment `split` of a decode row and the walk over them."""
    g, scoring = walk_args["geometry"], walk_args["scoring"]
    first = jnp.int32(0)
    if scoring.sliding_window is not None:
        first = _div(jnp.maximum(seq_len - scoring.sliding_window, 0), g.block_k) * g.block_k
    span = seq_len - first
    per_split = _cdiv(_cdiv(span, num_splits), g.block_k) * g.block_k
    start = first + split * per_split
    end = jnp.minimum(start + per_split, seq_len)
    positions = jnp.full((g.block_m,), seq_len - 1, jnp.int32)
    walk = _Walk(positions=positions, kv_end=end, **walk_args)
    num_full = _div(jnp.maximum(end - start, 0), g.block_k)
    if scoring.sliding_window is not None:
        num_full = jnp.int32(0)  # the window's first tile needs the mask
    return walk, _div(start, g.block_k), num_full, _cdiv(end, g.block_k)


def _decode_kernel(
    query_start_loc_ref, seq_lens_ref, block_tables_ref, num_seqs_ref, num_splits_ref,
    q_ref, kv_ref, acc_ref, m_ref, l_ref, *, geometry: _Geometry, scoring: Scoring,
):
    """Program (c, k): segment c % splits of row c // splits, kv head k -> partials at c."""
    program, kv_head = pl.program_id(0), pl.program_id(1)
    num_splits = num_splits_ref[0]
    row = jnp.minimum(_div(program, num_splits), seq_lens_ref.shape[0] - 1)
    q_start = query_start_loc_ref[row]
    seq_len = seq_lens_ref[row]
    is_active = (_div(program, num_splits) < num_seqs_ref[0]) & (seq_len > 0)
    is_active &= query_start_loc_ref[row + 1] - q_start == 1

    @pl.when(is_active)
    def _():
        g_vec, is_head = _head_rows(geometry, geometry.block_m)
        heads = kv_head * geometry.group + g_vec
        dims = jnp.arange(geometry.head_dim, dtype=jnp.int32)[None, :]
        q_index = (q_start, heads[:, None], dims)
        q_mask = _full_mask(is_head, geometry.head_dim)
        q = plgpu.load(q_ref.at[q_index], mask=q_mask, other=0).astype(kv_ref.dtype)
        walk_args = dict(
            kv_ref=kv_ref, block_tables_ref=block_tables_ref, row=row, kv_head=kv_head,
            q=q, geometry=geometry, scoring=scoring,
        )
        walk, first, num_full, end = _decode_segment(
            seq_len, _rem(program, num_splits), num_splits, walk_args
        )
        m, l, acc = _walk_tiles(walk, first, num_full, end)
        plgpu.store(acc_ref.at[program, kv_head, g_vec[:, None], dims], acc, mask=q_mask)
        plgpu.store(m_ref.at[program, kv_head, g_vec], m, mask=is_head)
        plgpu.store(l_ref.at[program, kv_head, g_vec], l, mask=is_head)


def _merge_kernel(
    query_start_loc_ref, seq_lens_ref, num_seqs_ref, num_splits_ref, acc_ref, m_ref, l_ref,
    _out_in_ref, out_ref, *, geometry: _Geometry,
):
    """Program (r, k): folds decode row r's segment partials and writes its output."""
    row, kv_head = pl.program_id(0), pl.program_id(1)
    num_splits = num_splits_ref[0]
    q_start = query_start_loc_ref[row]
    is_active = (row < num_seqs_ref[0]) & (seq_lens_ref[row] > 0)
    is_active &= query_start_loc_ref[row + 1] - q_start == 1

    @pl.when(is_active)
    def _():
        g_vec, is_head = _head_rows(geometry, pl.next_power_of_2(geometry.group))
        dims = jnp.arange(geometry.head_dim, dtype=jnp.int32)[None, :]
        mask = _full_mask(is_head, geometry.head_dim)

        def fold(split, carry):
            m, l, acc = carry
            program = row * num_splits + split
            m_s = plgpu.load(m_ref.at[program, kv_head, g_vec], mask=is_head, other=_MASK_VALUE)
            l_s = plgpu.load(l_ref.at[program, kv_head, g_vec], mask=is_head, other=0.0)
            index = (program, kv_head, g_vec[:, None], dims)
            acc_s = plgpu.load(acc_ref.at[index], mask=mask, other=0.0)
            m_new = jnp.maximum(m, m_s)
            alpha, beta = jnp.exp2(m - m_new), jnp.exp2(m_s - m_new)
            return m_new, l * alpha + l_s * beta, acc * alpha[:, None] + acc_s * beta[:, None]

        init = (
            jnp.full(g_vec.shape, _MASK_VALUE, jnp.float32),
            jnp.zeros(g_vec.shape, jnp.float32),
            jnp.zeros((g_vec.shape[0], geometry.head_dim), jnp.float32),
        )
        _, l, acc = jax.lax.fori_loop(0, num_splits, fold, init)
        heads = kv_head * geometry.group + g_vec
        out = _normalize(l, acc).astype(out_ref.dtype)
        plgpu.store(out_ref.at[q_start, heads[:, None], dims], out, mask=mask)


def _find_row(query_start_loc_ref, num_seqs: Array, block: Array, block_q: int) -> Array:
    """The last row r < num_seqs with query_start_loc[r] // block_q + r <= block."""
    lo, hi = jnp.int32(0), jnp.maximum(num_seqs - 1, 0)
    num_rows = query_start_loc_ref.shape[0] - 1
    for _ in range(num_rows.bit_length()):
        mid = _div(lo + hi + 1, 2)
        is_before = _div(query_start_loc_ref[mid], block_q) + mid <= block
        lo, hi = jnp.where(is_before, mid, lo), jnp.where(is_before, hi, mid - 1)
    return lo


def _prefill_kernel(
    query_start_loc_ref, seq_lens_ref, block_tables_ref, num_seqs_ref, q_ref, kv_ref,
    _out_in_ref, out_ref, *, geometry: _Geometry, scoring: Scoring,
):
    """Program (b, k): query block b of the step (the last blocks first), kv head k."""
    g = geometry
    block = pl.num_programs(0) - 1 - pl.program_id(0)
    kv_head = pl.program_id(1)
    row = _find_row(query_start_loc_ref, num_seqs_ref[0], block, g.block_q)
    row_start, row_end = query_start_loc_ref[row], query_start_loc_ref[row + 1]
    first_token = row_start + (block - _div(row_start, g.block_q) - row) * g.block_q
    is_active = (row < num_seqs_ref[0]) & (row_end - row_start > 1) & (first_token < row_end)

    @pl.when(is_active)
    def _():
        seq_len = seq_lens_ref[row]
        m_vec = jnp.arange(g.block_m, dtype=jnp.int32)
        tokens = first_token + _div(m_vec, g.group)
        heads = kv_head * g.group + _rem(m_vec, g.group)
        is_row = (m_vec < g.block_q * g.group) & (tokens < row_end)
        dims = jnp.arange(g.head_dim, dtype=jnp.int32)[None, :]
        index = (tokens[:, None], heads[:, None], dims)
        mask = _full_mask(is_row, g.head_dim)
        q = plgpu.load(q_ref.at[index], mask=mask, other=0).astype(kv_ref.dtype)
        first_pos = seq_len - (row_end - row_start) + (first_token - row_start)
        last_pos = jnp.minimum(first_pos + g.block_q - 1, seq_len - 1)
        walk = _Walk(
            kv_ref=kv_ref, block_tables_ref=block_tables_ref, row=row, kv_head=kv_head, q=q,
            positions=first_pos + _div(m_vec, g.group), kv_end=seq_len, geometry=g, scoring=scoring,
        )
        end_tile = _cdiv(last_pos + 1, g.block_k)
        if scoring.sliding_window is None:
            first_tile, num_full = jnp.int32(0), _div(first_pos + 1, g.block_k)
        else:
            first_tile = _div(jnp.maximum(first_pos - scoring.sliding_window + 1, 0), g.block_k)
            num_full = jnp.int32(0)
        _, l, acc = _walk_tiles(walk, first_tile, num_full, end_tile)
        plgpu.store(out_ref.at[index], _normalize(l, acc).astype(out_ref.dtype), mask=mask)


@dataclasses.dataclass(frozen=True)
class _Step:
    """The arrays and static settings that every launch of one call shares."""

    q: Array  # [T, N, H]
    kv_cache: Array  # [2, K, P, S, H]
    query_start_loc: Array  # [R + 1]
    seq_lens: Array  # [R]
    block_tables: Array  # [R, W]
    num_seqs: Array  # [1]
    scoring: Scoring
    interpret: bool

    def launch(self, kernel, grid, out_shape, tuning: KernelTuning, aliases=None):
        return pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=grid,
            input_output_aliases=aliases or {},
            interpret=self.interpret,
            compiler_params=plgpu.CompilerParams(
                num_warps=tuning.num_warps, num_stages=tuning.num_stages
            ),
            name=kernel.func.__name__.strip("_"),
        )


def _check_shapes(q: Array, kv_cache: Array) -> None:
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


# Jitted so a model's layers share one trace and lowering of the three launches.
@functools.partial(jax.jit, static_argnames=("scoring", "tuning", "interpret"))
def ragged_paged_attention(
    q: Float[Array, "T N H"],
    kv_cache: Float[Array, "2 K P S H"],
    query_start_loc: Int[Array, "R1"],
    seq_lens: Int[Array, "R"],
    block_tables: Int[Array, "R W"],
    num_seqs: Int[Array, "1"],
    *,
    scoring: Scoring,
    tuning: AttentionTuning | None = None,
    interpret: bool = False,
) -> Float[Array, "T N H"]:
    """Attends every real query token to its row's keys; padding tokens get 0."""
    _check_shapes(q, kv_cache)
    _, num_heads, head_dim = q.shape
    _, num_kv_heads, _, page_size, _ = kv_cache.shape
    tuning = tuning or default_tuning(head_dim, kv_cache.dtype)
    step = _Step(
        q, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, scoring, interpret
    )
    group = num_heads // num_kv_heads
    decode = _Geometry(
        num_kv_heads, group, head_dim, page_size,
        block_m=max(16, pl.next_power_of_2(group)), block_k=tuning.decode.block_k,
    )
    partials, num_splits = _decode(step, decode, tuning)
    out = _merge(step, decode, num_splits, partials)
    prefill = dataclasses.replace(
        decode, block_m=max(tuning.prefill.block_m, pl.next_power_of_2(group)),
        block_k=tuning.prefill.block_k,
    )
    return _prefill(step, prefill, tuning.prefill, out)


def _decode(step: _Step, g: _Geometry, tuning: AttentionTuning) -> tuple:
    """Launch 1: float32 partials [C, K, G, H] (acc), [C, K, G] (max, sum) of every segment,
    and the number of segments per row."""
    num_programs = max(step.seq_lens.shape[0], tuning.decode_programs)
    num_splits = jnp.clip(
        tuning.decode_programs // jnp.maximum(step.num_seqs, 1), 1, tuning.max_kv_splits
    ).astype(jnp.int32)
    shape = (num_programs, g.num_kv_heads, g.group)
    out_shape = (
        jax.ShapeDtypeStruct((*shape, g.head_dim), jnp.float32),
        jax.ShapeDtypeStruct(shape, jnp.float32),
        jax.ShapeDtypeStruct(shape, jnp.float32),
    )
    kernel = functools.partial(_decode_kernel, geometry=g, scoring=step.scoring)
    launch = step.launch(kernel, (num_programs, g.num_kv_heads), out_shape, tuning.decode)
    partials = launch(
        step.query_start_loc, step.seq_lens, step.block_tables, step.num_seqs, num_splits,
        step.q, step.kv_cache,
    )
    return partials, num_splits


def _merge(step: _Step, g: _Geometry, num_splits: Array, partials: tuple) -> Array:
    """Launch 2: the decode rows' outputs, in a zeroed [T, N, H] (padding tokens stay 0)."""
    out = jnp.zeros(step.q.shape, step.q.dtype)
    kernel = functools.partial(_merge_kernel, geometry=g)
    launch = step.launch(
        kernel, (step.seq_lens.shape[0], g.num_kv_heads), jax.ShapeDtypeStruct(out.shape, out.dtype),
        KernelTuning(num_warps=4), aliases={7: 0},
    )
    return launch(step.query_start_loc, step.seq_lens, step.num_seqs, num_splits, *partials, out)


def _prefill(step: _Step, g: _Geometry, tuning: KernelTuning, out: Array) -> Array:
    """Launch 3: rows with several query tokens, written into `out` in place."""
    num_blocks = pl.cdiv(step.q.shape[0], g.block_q) + step.seq_lens.shape[0]
    kernel = functools.partial(_prefill_kernel, geometry=g, scoring=step.scoring)
    launch = step.launch(
        kernel, (num_blocks, g.num_kv_heads), jax.ShapeDtypeStruct(out.shape, out.dtype), tuning,
        aliases={6: 0},
    )
    return launch(
        step.query_start_loc, step.seq_lens, step.block_tables, step.num_seqs, step.q,
        step.kv_cache, out,
    )
