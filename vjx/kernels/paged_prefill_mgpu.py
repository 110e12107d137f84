"""Paged, ragged prefill attention for Hopper GPUs in Pallas Mosaic GPU (TMA, wgmma and
warp-specialised warpgroups, after FlashAttention-3).

Legend: T tokens, R request rows, N query heads, K kv heads, G = N // K query heads per kv
head, H head dim, P pages, S page size, W block-table width, Q query tokens of one compute
warpgroup, L keys of one tile, B query blocks of the step.

A program (CTA) takes 2 * Q consecutive query tokens of one row with several query tokens
and one query head, in three warpgroups:
- warpgroup 2 (memory) walks the row's key tiles through its block table: each tile of L keys
  is one TMA copy per page (or per L-row slice of a page larger than L) into a shared-memory
  ring of `stages` slots, tracked by one barrier per slot; it refills a slot once both
  compute warpgroups have released it;
- warpgroups 0 and 1 (compute) each hold Q query tokens: S = q k^T by wgmma, an online
  softmax in float32 (base 2, the scale folded into log2(e)), then acc += p v by wgmma.
  Tiles wholly before a warpgroup's first token are unmasked; the rest are masked causally,
  aligned to the end of the row. The two warpgroups take turns on the tensor cores (one's
  softmax overlaps the other's matmuls) through a shared schedule barrier.
A block's Q tile starts on a multiple of 8 tokens (TMA reads a tiled shared-memory tile's
global rows in whole 8-row tiles), so a row's first block may begin up to 7 tokens before the
row. Only the row's own tokens are stored, by TMA from an untiled tile in a ladder of
power-of-two row counts, so no other row's token is ever written.

Rows with one query token (decode) and padding tokens are not touched: the caller writes
them (vjx/kernels/ragged_paged_attention.py runs its decode and merge launches on this
launch's output). The schedule of query blocks (row, first token) is computed by XLA from
`query_start_loc`, longest-running blocks first.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxtyping import Array, Float, Int

_LOG2E = math.log2(math.e)
_COMPUTE_WARPGROUPS = 2


@dataclasses.dataclass(frozen=True)
class MosaicPrefillTuning:
    """Tile shape of the Mosaic GPU prefill kernel (static; a change is a recompile)."""

    block_q: int = 64
    """Query tokens per compute warpgroup (the M of its wgmma: a multiple of 64)."""
    block_kv: int = 128
    """Keys per tile (a multiple of 64)."""
    stages: int = 2
    """Key/value tiles in flight (the shared-memory ring's slots)."""

    def __post_init__(self):
        for name in ("block_q", "block_kv"):
            if getattr(self, name) % 64 or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive multiple of 64, got {getattr(self, name)}.")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}.")


# Query tiles start on a multiple of 8 tokens: a TMA copy into a shared-memory tile of 8-row
# tiling takes its global rows in whole tiles, so an unaligned start would read shifted rows.
ROW_ALIGNMENT = 8


def supports(q: Array, kv_cache: Array, tuning: MosaicPrefillTuning) -> bool:
    """Whether the kernel takes these shapes: 16-bit q and cache of one dtype, head dims 64
    and 128, pages that tile the key tiles, and a step of at least one query block of tokens
    (a Q tile never reads past the last token), a multiple of 8 of them (aligned Q tiles)."""
    num_tokens, _, head_dim = q.shape
    page_size = kv_cache.shape[3]
    is_16_bit = jnp.dtype(q.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    pages_fit = page_size % 8 == 0 and (tuning.block_kv % page_size == 0 or page_size % tuning.block_kv == 0)
    tokens_fit = num_tokens >= _COMPUTE_WARPGROUPS * tuning.block_q and num_tokens % ROW_ALIGNMENT == 0
    return is_16_bit and q.dtype == kv_cache.dtype and head_dim in (64, 128) and pages_fit and tokens_fit


def num_query_blocks(num_tokens: int, max_rows: int, block_tokens: int) -> int:
    """Query blocks of a step at most: n rows with several tokens, T tokens in all, each row's
    blocks starting up to 7 tokens before it, fill at most (T + 7n) // block_tokens + n blocks,
    a bound that grows with n <= min(R, T // 2)."""
    rows = max(1, min(max_rows, num_tokens // 2))
    return (num_tokens + (ROW_ALIGNMENT - 1) * rows) // block_tokens + rows


def query_block_schedule(
    query_start_loc: Int[Array, " R1"], num_seqs: Int[Array, "1"], num_blocks: int, block_tokens: int
) -> Int[Array, "B 2"]:
    """(row, first token) of each query block of the rows with several query tokens, each
    row's last block (the most keys) first; (-1, 0) past the last block. A row's blocks start
    at its first token rounded down to a multiple of 8 (ROW_ALIGNMENT)."""
    num_rows = query_start_loc.shape[0] - 1
    aligned_starts = query_start_loc[:-1] - query_start_loc[:-1] % ROW_ALIGNMENT
    spans = query_start_loc[1:] - aligned_starts
    is_prefill = (jnp.arange(num_rows) < num_seqs[0]) & (jnp.diff(query_start_loc) > 1)
    blocks = jnp.where(is_prefill, (spans + block_tokens - 1) // block_tokens, 0)
    ends = jnp.cumsum(blocks)
    block = jnp.arange(num_blocks, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(ends, block, side="right"), num_rows - 1).astype(jnp.int32)
    tile = ends[row] - 1 - block
    first = aligned_starts[row] + tile * block_tokens
    is_block = block < ends[-1]
    return jnp.stack([jnp.where(is_block, row, -1), jnp.where(is_block, first, 0)], axis=1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class _Shape:
    group: int
    head_dim: int
    page_size: int
    width: int  # W
    tuning: MosaicPrefillTuning
    sm_scale: float
    interpret: bool

    def in_layout(self, x: Array, layout) -> Array:
        """`x` in the register layout of a wgmma result (the interpreter has no layouts)."""
        return x if self.interpret else plgpu.layout_cast(x, layout)

    @property
    def copy_rows(self) -> int:
        """Rows of one TMA copy of a key tile: a whole page, or an L-row slice of one."""
        return min(self.page_size, self.tuning.block_kv)


@dataclasses.dataclass(frozen=True)
class _Block:
    """What both kinds of warpgroup know about the program's query block."""

    row: Array
    first: Array  # the block's first token (a multiple of 8: it may precede the row's start)
    start: Array  # the row's first token
    end: Array  # the row's end token
    context: Array  # keys before the row's first query token
    num_steps: Array  # key tiles the program walks

    @classmethod
    def create(cls, refs, row: Array, first: Array, shape: _Shape) -> "_Block":
        start, end = refs["query_start_loc"][row], refs["query_start_loc"][row + 1]
        context = refs["seq_lens"][row] - (end - start)
        last = jnp.minimum(first + _COMPUTE_WARPGROUPS * shape.tuning.block_q, end)
        keys = context + (last - start)
        return cls(row, first, start, end, context, pl.cdiv(keys, jnp.int32(shape.tuning.block_kv)))


def _memory_warpgroup(refs, smem, barriers, blk: _Block, shape: _Shape):
    """Issues each key tile's K and V copies into the ring, waiting for a slot to be free."""
    plgpu.set_max_registers(40, action="decrease")
    kv_head = lax.div(lax.axis_index("heads"), jnp.int32(shape.group))
    stages = shape.tuning.stages
    copies = shape.tuning.block_kv // shape.copy_rows

    def pages(step: Array) -> tuple:
        """The block-table entries of tile `step`'s copies (clamped to the table's width)."""
        keys = (step * shape.tuning.block_kv + i * shape.copy_rows for i in range(copies))
        columns = (jnp.minimum(lax.div(key, jnp.int32(shape.page_size)), shape.width - 1) for key in keys)
        return tuple(refs["block_tables"][blk.row, column] for column in columns)

    def step_body(step, tile_pages):
        # The next tile's page ids are loaded before this tile's wait, which hides their latency.
        next_pages = pages(step + 1)
        slot = lax.rem(step, jnp.int32(stages))
        offset = lax.rem(step * shape.tuning.block_kv, jnp.int32(shape.page_size))  # 0 unless S > L
        for kv, name in ((0, "k"), (1, "v")):

            @pl.when(step >= stages)
            def _(name=name):
                plgpu.barrier_wait(barriers[f"{name}_consumed"].at[slot])

            for i, page in enumerate(tile_pages):
                src = refs["kv_cache"].at[kv, kv_head, page, pl.ds(offset, shape.copy_rows)]
                dst = smem[name].at[slot, pl.ds(i * shape.copy_rows, shape.copy_rows)]
                plgpu.copy_gmem_to_smem(src, dst, barriers[name].at[slot])
        return next_pages

    lax.fori_loop(0, blk.num_steps, step_body, pages(jnp.int32(0)))

    # Wait for the last tiles' release too, so that every phase of the ring is observed.
    @pl.loop(jnp.maximum(blk.num_steps - stages, 0), blk.num_steps)
    def _(step):
        slot = lax.rem(step, jnp.int32(stages))
        plgpu.barrier_wait(barriers["k_consumed"].at[slot])
        plgpu.barrier_wait(barriers["v_consumed"].at[slot])


def schedule_barrier(barriers) -> None:
    """One turn of the two compute warpgroups on the tensor cores."""
    plgpu.barrier_arrive(barriers["schedule"])
    plgpu.barrier_wait(barriers["schedule"])


@dataclasses.dataclass(frozen=True)
class _Walk:
    """One compute warpgroup's walk over the key tiles."""

    q_smem: object
    smem: dict
    barriers: dict
    shape: _Shape
    num_steps: Array  # tiles this warpgroup attends to
    tile_pos: Array  # the position of the Q tile's row 0

    def step(self, step: Array, carry: tuple, masked: bool) -> tuple:
        """S = q k^T, the online softmax, acc += p v; releases the tile's slot."""
        acc, m, l = carry
        shape, barriers = self.shape, self.barriers
        block_q, block_kv, stages = shape.tuning.block_q, shape.tuning.block_kv, shape.tuning.stages
        slot = lax.rem(step, jnp.int32(stages))
        s = _scores(self.q_smem, self.smem["k"].at[slot], shape, then=lambda: schedule_barrier(barriers))
        plgpu.barrier_arrive(barriers["k_consumed"].at[slot])
        s = s * (shape.sm_scale * _LOG2E)
        if masked:
            rows = shape.in_layout(lax.broadcasted_iota(jnp.int32, (block_q, block_kv), 0), plgpu.Layout.WGMMA)
            keys = shape.in_layout(lax.broadcasted_iota(jnp.int32, (block_q, block_kv), 1), plgpu.Layout.WGMMA)
            s = jnp.where(self.tile_pos + rows >= keys + step * block_kv, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
        l = l * alpha + p.sum(axis=1)
        p = p.astype(self.q_smem.dtype)
        acc, l, m_new, p = lax.optimization_barrier((acc, l, m_new, p))
        plgpu.barrier_arrive(barriers["schedule"])
        plgpu.barrier_wait(barriers["v"].at[slot])
        plgpu.barrier_wait(barriers["schedule"])

        def wait_next_keys():
            next_step = step + 1

            @pl.when(next_step < self.num_steps)
            def _():
                plgpu.barrier_wait(barriers["k"].at[lax.rem(next_step, jnp.int32(stages))])

        acc = _accumulate(acc, p, self.smem["v"].at[slot], shape, then=wait_next_keys)
        plgpu.barrier_arrive(barriers["v_consumed"].at[slot])
        return acc, m_new, l

    def flush(self, step: Array, carry):
        """A tile only the other warpgroup attends to: release it and keep the turns (its
        arrival is waited for too, so that every phase of the ring is observed)."""
        slot = lax.rem(step, jnp.int32(self.shape.tuning.stages))
        for name in ("k", "v"):
            plgpu.barrier_wait(self.barriers[name].at[slot])
        for name in ("k_consumed", "v_consumed"):
            plgpu.barrier_arrive(self.barriers[name].at[slot])
        schedule_barrier(self.barriers)
        schedule_barrier(self.barriers)
        return carry


def _compute_warpgroup(refs, smem, barriers, blk: _Block, shape: _Shape):
    """Attends this warpgroup's Q query tokens to their keys and stores the real rows."""
    plgpu.set_max_registers(232, action="increase")
    wg, head = lax.axis_index("wg"), lax.axis_index("heads")
    block_q, block_kv = shape.tuning.block_q, shape.tuning.block_kv
    q_smem = smem["q"].at[wg]
    # This warpgroup's real rows are tokens [first, first + num_rows) of the row; its Q tile
    # starts at `loaded`, `skip` rows earlier (a block starting before the row, and at the
    # step's end a tile that never reads past the last token: TMA's out-of-bounds fill is not
    # relied on). Only the real rows are stored.
    tile_first = blk.first + wg * block_q
    first = jnp.maximum(tile_first, blk.start)
    num_rows = jnp.clip(jnp.minimum(tile_first + block_q, blk.end) - first, 0, block_q)
    loaded = jnp.minimum(tile_first, refs["q"].shape[0] - block_q)
    skip = first - loaded
    first_pos = blk.context + (first - blk.start)
    num_steps = jnp.where(num_rows > 0, pl.cdiv(first_pos + num_rows, jnp.int32(block_kv)), 0)
    num_full = jnp.minimum(lax.div(first_pos + 1, jnp.int32(block_kv)), num_steps)
    walk = _Walk(q_smem, smem, barriers, shape, num_steps, first_pos - skip)

    plgpu.copy_gmem_to_smem(refs["q"].at[pl.ds(loaded, block_q), head], q_smem, barriers["q"].at[wg])
    plgpu.barrier_wait(barriers["q"].at[wg])
    m = shape.in_layout(jnp.full((block_q,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
    l = shape.in_layout(jnp.full((block_q,), 0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
    acc = shape.in_layout(jnp.full((block_q, shape.head_dim), 0, jnp.float32), plgpu.Layout.WGMMA)

    @pl.when(num_steps > 0)
    def _():
        plgpu.barrier_wait(barriers["k"].at[0])

    pl.when(wg == 1)(lambda: schedule_barrier(barriers))
    carry = lax.fori_loop(0, num_full, functools.partial(walk.step, masked=False), (acc, m, l))
    acc, m, l = lax.fori_loop(num_full, num_steps, functools.partial(walk.step, masked=True), carry)
    lax.fori_loop(num_steps, blk.num_steps, walk.flush, None)
    pl.when(wg == 0)(lambda: schedule_barrier(barriers))

    out = acc / lax.broadcast_in_dim(jnp.maximum(l, 1e-30), acc.shape, [0])
    o_smem = smem["o"].at[wg]
    o_smem[...] = out.astype(o_smem.dtype)
    plgpu.commit_smem()
    _store_rows(o_smem, refs["out"], (first, skip, num_rows), head, block_q)


def _scores(q_smem, k_smem, shape: _Shape, then) -> Array:
    """q k^T in float32 by wgmma, running `then` while the tensor cores work. The interpreter
    (CI) takes no transposed or register operand in its wgmma, so there the two matmuls are
    plain dots of the same shared-memory tiles."""
    if shape.interpret:
        s = jnp.dot(q_smem[...], k_smem[...].T, preferred_element_type=jnp.float32)
        then()
        return s

    def scope(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
        then()
        return acc_ref[...]

    return pl.run_scoped(scope, plgpu.ACC((shape.tuning.block_q, shape.tuning.block_kv), jnp.float32))


def _accumulate(acc: Array, p: Array, v_smem, shape: _Shape, then) -> Array:
    """acc + p v, accumulated in place by wgmma, running `then` while the tensor cores work."""
    if shape.interpret:
        acc = acc + jnp.dot(p, v_smem[...], preferred_element_type=jnp.float32)
        then()
        return acc

    def scope(acc_ref):
        plgpu.wgmma(acc_ref, p, v_smem)
        then()

    return pl.run_state(scope)(plgpu.ACC.init(acc))


def _store_rows(o_smem, out_ref, rows: tuple, head: Array, block_q: int):
    """Stores rows [skip, skip + num_rows) of `o_smem` at tokens [first, first + num_rows) in a
    ladder of power-of-two TMA copies (TMA boxes are static), so no other row is written."""
    first, skip, num_rows = rows
    offset = jnp.int32(0)
    size = block_q
    while size >= 1:

        @pl.when(num_rows & size != 0)
        def _(offset=offset, size=size):
            src = o_smem.at[pl.ds(skip + offset, size)]
            plgpu.copy_smem_to_gmem(src, out_ref.at[pl.ds(first + offset, size), head])

        offset = offset + (num_rows & size)
        size //= 2
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _kernel(schedule, query_start_loc, seq_lens, block_tables, q, kv_cache, out, *scratch, shape: _Shape):
    refs = dict(
        schedule=schedule,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        q=q,
        kv_cache=kv_cache,
        out=out,
    )
    (q_smem, k_smem, v_smem, o_smem), (q_bar, k_bar, v_bar), (k_used, v_used), schedule_bar = scratch
    smem = dict(q=q_smem, k=k_smem, v=v_smem, o=o_smem)
    barriers = dict(q=q_bar, k=k_bar, v=v_bar, k_consumed=k_used, v_consumed=v_used, schedule=schedule_bar)
    block = lax.axis_index("blocks")
    row = schedule[block, 0]

    @pl.when(row >= 0)
    def _():
        blk = _Block.create(refs, row, schedule[block, 1], shape)
        wg = lax.axis_index("wg")
        pl.when(wg < _COMPUTE_WARPGROUPS)(lambda: _compute_warpgroup(refs, smem, barriers, blk, shape))
        pl.when(wg == _COMPUTE_WARPGROUPS)(lambda: _memory_warpgroup(refs, smem, barriers, blk, shape))


def _interpret_params():
    """Mosaic GPU's CPU interpreter (public as `plgpu.InterpretGPUParams` from JAX 0.11)."""
    if hasattr(plgpu, "InterpretGPUParams"):
        return plgpu.InterpretGPUParams()
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams()


def _scratch(shape: _Shape, dtype) -> tuple:
    t = shape.tuning
    swizzled = dict(transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))
    smem = (
        plgpu.SMEM((_COMPUTE_WARPGROUPS, t.block_q, shape.head_dim), dtype, **swizzled),
        plgpu.SMEM((t.stages, t.block_kv, shape.head_dim), dtype, **swizzled),
        plgpu.SMEM((t.stages, t.block_kv, shape.head_dim), dtype, **swizzled),
        plgpu.SMEM((_COMPUTE_WARPGROUPS, t.block_q, shape.head_dim), dtype),
    )
    copies = t.block_kv // shape.copy_rows
    ready = (
        plgpu.Barrier(num_barriers=_COMPUTE_WARPGROUPS),
        plgpu.Barrier(num_arrivals=copies, num_barriers=t.stages),
        plgpu.Barrier(num_arrivals=copies, num_barriers=t.stages),
    )
    consumed = (plgpu.Barrier(num_arrivals=_COMPUTE_WARPGROUPS, num_barriers=t.stages),) * 2
    return smem, ready, consumed, plgpu.Barrier(num_arrivals=_COMPUTE_WARPGROUPS)


@functools.partial(jax.jit, static_argnames=("sm_scale", "tuning", "interpret"))
def paged_prefill_attention(
    q: Float[Array, "T N H"],
    kv_cache: Float[Array, "2 K P S H"],
    query_start_loc: Int[Array, " R1"],
    seq_lens: Int[Array, " R"],
    block_tables: Int[Array, "R W"],
    num_seqs: Int[Array, "1"],
    *,
    sm_scale: float,
    tuning: MosaicPrefillTuning = MosaicPrefillTuning(),
    interpret: bool = False,
) -> Float[Array, "T N H"]:
    """Causal attention of the query tokens of every row with more than one query token; the
    other tokens' rows of the result are not written (the caller writes them)."""
    num_tokens, num_heads, head_dim = q.shape
    _, num_kv_heads, _, page_size, _ = kv_cache.shape
    if not supports(q, kv_cache, tuning):
        raise ValueError(
            f"The Mosaic GPU prefill kernel takes bf16/f16 q and cache of one dtype, head_dim 64 or 128, pages "
            f"that tile {tuning.block_kv} keys and a multiple of 8 tokens, at least {2 * tuning.block_q}; got "
            f"{q.dtype}/{kv_cache.dtype}, {head_dim}, {page_size}, {num_tokens}."
        )
    shape = _Shape(num_heads // num_kv_heads, head_dim, page_size, block_tables.shape[1], tuning, sm_scale, interpret)
    block_tokens = _COMPUTE_WARPGROUPS * tuning.block_q
    num_blocks = num_query_blocks(num_tokens, seq_lens.shape[0], block_tokens)
    schedule = query_block_schedule(query_start_loc, num_seqs, num_blocks, block_tokens)
    kernel = plgpu.kernel(
        functools.partial(_kernel, shape=shape),
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_types=_scratch(shape, q.dtype),
        grid=(num_heads, num_blocks),
        grid_names=("heads", "blocks"),
        num_threads=_COMPUTE_WARPGROUPS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=_interpret_params() if interpret else False,
    )
    return kernel(schedule, query_start_loc, seq_lens, block_tables, q, kv_cache)
