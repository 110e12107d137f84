"""Mamba2's chunked SSD scan over one ragged step on GPUs in Pallas (Triton lowering).

Legend: T tokens in the padded batch, R request rows, H heads, P head dim, G groups (head h
reads group h // (H / G) of B and C), N state dim, Q tokens of one kernel chunk, E heads of a
program, Pb the head-dim columns of a program (its block of P).

Computes what vjx/mamba/ssd.py's `mamba_chunk_scan_combined` (the reference) computes: per
head, h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T and y_t = h_t C_t + D x_t, from each row's
given state. dt = clamp(softplus(dt + dt_bias), dt_limit) is taken in jnp before the launch
(a [T, H] float32 array); the rest happens in one launch.

Grid (R + 1, H / E, P / Pb). Program (r, e, b), r < R, walks row r's tokens
[query_start_loc[r], query_start_loc[r + 1]) in chunks of Q aligned to the row's start, in
order, holding the [Pb, N] state of each of its E heads in float32 across the chunks. Per
chunk it loads B and C [Q, N] once (its heads share a group) and takes C B^T [Q, Q]; then
per head:
    decay[l, s] = exp(sum of dt A over positions s+1..l) for s <= l, else 0
        (summed directly, as the reference does, not as a difference of cumulative sums)
    y = (C B^T * decay * dt_s) x + exp(cumsum dt A)_l C h^T + D x     -> written, [Q, Pb]
    h = exp(sum dt A) h + (x * decay[Q - 1, s] dt_s)^T B              -> carried, [Pb, N]
Loads past the row's end are masked to 0 (no input, no decay), so no other row's token
reaches the state. The final state is written over the initial one (aliased), so a row with
no tokens (a padding row) exits at once and keeps its state. Program (R, e, b) writes zeros
to the padding tokens [query_start_loc[R], T) (padding rows have empty ranges), so every
output element is written exactly once.

The scan's result does not depend on where chunks are cut, except for rounding, so the
kernel's chunk is Q = min(chunk_size, tuning.block_t): Mamba2's chunk of 256 would make the
[Q, Q] tiles too large for registers. Both are powers of two, so each of the reference's
chunks is a whole number of the kernel's.

Dots take operands in x's dtype (the state and the weighted x are cast to it for their dots,
as vLLM's Triton kernels do) and accumulate in float32; float32 operands use full-precision
dots. A long prefill row is walked by H / E * P / Pb programs in sequence over its chunks:
the grid has no parallelism along a row's tokens.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float

from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.kv_walk import cdiv, div, full_mask
from vjx.mamba.ssd import DEFAULT_DT_LIMIT, SsdInputs


def _is_power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


@dataclasses.dataclass(frozen=True)
class SsdTuning:
    """Tile shape and Triton schedule of the scan. The defaults are starting points, never
    swept on a GPU: Q = 64 keeps the [Q, Q] tiles and a [32, 128] float32 state (Mamba2's
    head dim 64 cut in two, state dim 128) within a program's registers."""

    block_t: int = 64
    """Tokens per kernel chunk at most (a power of two >= 16): Q = min(chunk_size, block_t)."""
    block_p: int = 32
    """Head-dim columns per program at most (a power of two >= 16): Pb = min(P, block_p). A
    smaller block gives more programs and a smaller state, and recomputes C B^T per block."""
    heads: int = 1
    """E: heads per program. They share each chunk's B and C loads and C B^T, so E must
    divide the heads of a group (H / G)."""
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_t", "block_p"):
            value = getattr(self, name)
            if not _is_power_of_two(value) or value < 16:
                raise ValueError(f"{name} must be a power of two >= 16, got {value}.")
        if self.heads < 1:
            raise ValueError(f"heads must be >= 1, got {self.heads}.")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}.")
        if not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages must be in [1, 6], got {self.num_stages}.")


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Static shapes of the launch."""

    chunk: int  # Q
    block_p: int  # Pb
    heads: int  # E
    heads_per_group: int  # H / G
    state_dim: int  # N


@dataclasses.dataclass(frozen=True)
class _Block:
    """What one program covers: E heads and Pb head-dim columns."""

    heads: list  # E int32 scalars, consecutive, of one group
    cols: Array  # [Pb]
    geometry: _Geometry


@dataclasses.dataclass(frozen=True)
class _Refs:
    query_start_loc: object  # [R + 1]
    x: object  # [T, H, P]
    dt: object  # [T, H] float32, discretized
    A: object  # [H] float32
    B: object  # [T, G, N]
    C: object  # [T, G, N]
    D: object  # [H] float32
    state_in: object  # [R, H, P, N] float32, aliased to `state`
    y: object  # [T, H, P]
    state: object  # [R, H, P, N] float32


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """One chunk of a row: its tokens and what its heads share."""

    tokens: Array  # [Q]
    is_token: Array  # [Q]: inside the row
    B: Array  # [Q, N], x's dtype, 0 past the row
    C: Array  # [Q, N]
    CB: Array  # [Q, Q] float32: C B^T


def _dot(a: Array, b: Array, contract: tuple[int, int]) -> Array:
    """a and b contracted over dims `contract` (2-D), float32 accumulation; float32 operands
    use full precision (Triton's default for them is tf32)."""
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _decay_matrix(log_decay: Array, chunk: int) -> Array:
    """[l, s] = exp(sum of log_decay over positions s+1..l) for s <= l, 0 above the diagonal."""
    position = jnp.arange(chunk, dtype=jnp.int32)
    is_after_s = position[:, None] > position[None, :]
    sums = jax.lax.cumsum(jnp.where(is_after_s, log_decay[:, None], 0.0), axis=0)
    return jnp.where(position[:, None] >= position[None, :], jnp.exp(sums), 0.0)


def _scan_head(refs: _Refs, chunk: _Chunk, head: Array, state: Array, block: _Block) -> Array:
    """Writes one head's outputs over the chunk (the block's columns) and returns its end state."""
    dtype, g = refs.x.dtype, block.geometry
    x_index = (chunk.tokens[:, None], head, block.cols[None, :])
    x_mask = full_mask(chunk.is_token, g.block_p)
    x = plgpu.load(refs.x.at[x_index], mask=x_mask, other=0.0)
    dt = plgpu.load(refs.dt.at[chunk.tokens, head], mask=chunk.is_token, other=0.0)
    log_decay = dt * refs.A[head]
    decay = _decay_matrix(log_decay, g.chunk)
    scores = chunk.CB * decay * dt[None, :]
    y = _dot(scores.astype(dtype), x, (1, 0))
    decay_in = jnp.exp(jax.lax.cumsum(log_decay, axis=0))
    y = y + decay_in[:, None] * _dot(chunk.C, state.astype(dtype), (1, 1))
    x = x.astype(jnp.float32)
    y = y + refs.D[head] * x
    plgpu.store(refs.y.at[x_index], y.astype(refs.y.dtype), mask=x_mask)
    position = jnp.arange(g.chunk, dtype=jnp.int32)
    decay_out = jnp.sum(jnp.where(position[:, None] == g.chunk - 1, decay, 0.0), axis=0)
    weighted = (x * (decay_out * dt)[:, None]).astype(dtype)
    return jnp.exp(jnp.sum(log_decay)) * state + _dot(weighted, chunk.B, (0, 0))


def _chunk_step(index: Array, states: tuple, *, refs: _Refs, span: tuple, block: _Block) -> tuple:
    """Chunk `index` of the row whose tokens are [span[0], span[1]): the E heads' states after it."""
    start, end = span
    g = block.geometry
    tokens = start + index * g.chunk + jnp.arange(g.chunk, dtype=jnp.int32)
    is_token = tokens < end
    group = div(block.heads[0], g.heads_per_group)
    n_index = (tokens[:, None], group, jnp.arange(g.state_dim, dtype=jnp.int32)[None, :])
    mask = full_mask(is_token, g.state_dim)
    B, C = (plgpu.load(ref.at[n_index], mask=mask, other=0.0).astype(refs.x.dtype) for ref in (refs.B, refs.C))
    chunk = _Chunk(tokens, is_token, B, C, _dot(C, B, (1, 1)))
    return tuple(_scan_head(refs, chunk, head, state, block) for head, state in zip(block.heads, states))


def _scan_row(refs: _Refs, row: Array, block: _Block):
    """Walks row `row`'s chunks from its initial states and writes its final states; a row
    without tokens leaves its states as they are."""
    g = block.geometry
    start, end = refs.query_start_loc[row], refs.query_start_loc[row + 1]

    @pl.when(end > start)
    def _():
        n = jnp.arange(g.state_dim, dtype=jnp.int32)[None, :]
        indices = [(row, head, block.cols[:, None], n) for head in block.heads]
        states = tuple(plgpu.load(refs.state_in.at[index]) for index in indices)
        step = functools.partial(_chunk_step, refs=refs, span=(start, end), block=block)
        states = jax.lax.fori_loop(0, cdiv(end - start, g.chunk), step, states)
        for index, state in zip(indices, states):
            plgpu.store(refs.state.at[index], state)


def _zero_padding_tokens(refs: _Refs, block: _Block):
    """Writes 0 to the padding tokens [query_start_loc[R], T) of the block's heads and columns."""
    g = block.geometry
    num_tokens = refs.y.shape[0]
    first = refs.query_start_loc[refs.state.shape[0]]
    zeros = jnp.zeros((g.chunk, g.block_p), refs.y.dtype)

    def zero_chunk(index, carry):
        tokens = first + index * g.chunk + jnp.arange(g.chunk, dtype=jnp.int32)
        mask = full_mask(tokens < num_tokens, g.block_p)
        for head in block.heads:
            plgpu.store(refs.y.at[tokens[:, None], head, block.cols[None, :]], zeros, mask=mask)
        return carry

    jax.lax.fori_loop(0, cdiv(num_tokens - first, g.chunk), zero_chunk, 0)


def _ssd_kernel(*kernel_refs, geometry: _Geometry):
    """Program (r, e, b): row r's scan (r < R) or the padding tokens (r == R), for heads
    [e E, (e + 1) E) and head-dim columns [b Pb, (b + 1) Pb)."""
    refs, g = _Refs(*kernel_refs), geometry
    row, head_block, col_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    num_rows = refs.state.shape[0]
    heads = [head_block * g.heads + i for i in range(g.heads)]
    block = _Block(heads, col_block * g.block_p + jnp.arange(g.block_p, dtype=jnp.int32), g)

    @pl.when(row < num_rows)
    def _():
        _scan_row(refs, row, block)

    @pl.when(row == num_rows)
    def _():
        _zero_padding_tokens(refs, block)


def _power_of_two_at_least_16(name: str, value: int) -> None:
    if not _is_power_of_two(value) or value < 16:
        raise ValueError(f"{name} must be a power of two >= 16 (16, 32, 64, 128, ...), got {value}.")


def _geometry(x_THP: Array, B_TGN: Array, chunk_size: int, tuning: SsdTuning) -> _Geometry:
    """The launch's static shapes; a ValueError for a shape the kernel cannot take."""
    num_heads, head_dim = x_THP.shape[1:]
    num_groups, state_dim = B_TGN.shape[1:]
    _power_of_two_at_least_16("head_dim (x_THP.shape[2])", head_dim)
    _power_of_two_at_least_16("the state dim (B_TGN.shape[2])", state_dim)
    _power_of_two_at_least_16("chunk_size", chunk_size)
    if num_heads % num_groups:
        raise ValueError(f"the heads ({num_heads}) must be a multiple of the groups of B and C ({num_groups}).")
    heads_per_group = num_heads // num_groups
    if heads_per_group % tuning.heads:
        raise ValueError(
            f"tuning.heads must divide the heads of a group ({heads_per_group} = {num_heads} heads / "
            f"{num_groups} groups), got {tuning.heads}."
        )
    return _Geometry(
        chunk=min(chunk_size, tuning.block_t),
        block_p=min(head_dim, tuning.block_p),
        heads=tuning.heads,
        heads_per_group=heads_per_group,
        state_dim=state_dim,
    )


def _check_shapes(x_THP: Array, dt_TH: Array, B_TGN: Array, C_TGN: Array, ssm_state: Array, md) -> None:
    num_tokens, num_heads, head_dim = x_THP.shape
    state_dim = B_TGN.shape[2]
    if dt_TH.shape != (num_tokens, num_heads):
        raise ValueError(f"dt_TH must be [{num_tokens}, {num_heads}] (tokens, heads), got {dt_TH.shape}.")
    if B_TGN.shape[0] != num_tokens or C_TGN.shape != B_TGN.shape:
        raise ValueError(f"B_TGN and C_TGN must both be [{num_tokens}, G, N], got {B_TGN.shape} and {C_TGN.shape}.")
    if ssm_state.shape[1:] != (num_heads, head_dim, state_dim):
        raise ValueError(
            f"ssm_state must be [R, {num_heads}, {head_dim}, {state_dim}] (rows, heads, head dim, state dim), "
            f"got {ssm_state.shape}."
        )
    if md.query_start_loc.shape != (ssm_state.shape[0] + 1,):
        raise ValueError(
            f"md.query_start_loc must have one entry more than ssm_state has rows ({ssm_state.shape[0]}), "
            f"got shape {md.query_start_loc.shape}."
        )


@functools.partial(jax.jit, static_argnames=("chunk_size", "dt_limit", "tuning", "interpret"))
def mamba_chunk_scan_combined(
    inputs: SsdInputs,
    ssm_state_RHPN: Float[Array, "R H P N"],
    md: AttentionMetadata,
    *,
    chunk_size: int,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
    tuning: SsdTuning | None = None,
    interpret: bool = False,
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """vjx.mamba.ssd.mamba_chunk_scan_combined in one Pallas launch: y over every real token
    (x's dtype, D skip included, 0 for padding tokens) and each row's final state (float32).
    `ssm_state_RHPN` is each row's state before the step; head_dim, the state dim and
    `chunk_size` must be powers of two >= 16. Padding rows must have empty query ranges."""
    x_THP, dt_TH, A_H, B_TGN, C_TGN, D_H, dt_bias_H = inputs
    tuning = tuning or SsdTuning()
    g = _geometry(x_THP, B_TGN, chunk_size, tuning)
    _check_shapes(x_THP, dt_TH, B_TGN, C_TGN, ssm_state_RHPN, md)
    dt_TH = jax.nn.softplus(dt_TH.astype(jnp.float32) + dt_bias_H.astype(jnp.float32))
    dt_TH = jnp.clip(dt_TH, *dt_limit)
    num_rows, num_heads, head_dim, _ = ssm_state_RHPN.shape
    operands = (md.query_start_loc, x_THP, dt_TH, A_H.astype(jnp.float32), B_TGN, C_TGN, D_H.astype(jnp.float32))
    call = pl.pallas_call(
        functools.partial(_ssd_kernel, geometry=g),
        out_shape=(
            jax.ShapeDtypeStruct(x_THP.shape, x_THP.dtype),
            jax.ShapeDtypeStruct(ssm_state_RHPN.shape, jnp.float32),
        ),
        grid=(num_rows + 1, num_heads // g.heads, head_dim // g.block_p),
        input_output_aliases={len(operands): 1},  # the final states over the initial ones
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=tuning.num_warps, num_stages=tuning.num_stages),
        name="ssd_scan",
    )
    return call(*operands, ssm_state_RHPN.astype(jnp.float32))
