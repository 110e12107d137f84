"""Mamba2's selective state space update over one ragged step, in pure jnp.

Legend: T tokens in the padded batch, R request rows, H heads, P head dim, G groups (head h
reads group h // (H / G) of B and C), N state dim, M chunks of the step, Q
positions of one chunk (`chunk_size`), L and Q also as the query and source positions of a
chunk's quadratic form.

State layout: `ssm_state [R, H, P, N]`, each row's state before the step (the layer gathers
it from the row's state slot, zeros for a row that starts afresh, and writes the returned
final states back; the math runs in float32). Per head, with dt = clamp(softplus(dt_raw + dt_bias), dt_limit)
and A < 0 (A = -exp(A_log)):
    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T        [P, N]
    y_t = h_t C_t + D x_t                             [P]
starting from the row's given state; every row's final state is returned (float32).

Two forms of the same recurrence, as in vLLM:
- `selective_state_update` (decode): one token per row; each row's state is gathered, updated
  once and scattered back.
- `mamba_chunk_scan_combined` (the SSD algorithm, ragged): each row's tokens are split into
  chunks of Q aligned to the row's start, so no chunk spans two rows (at most
  ceil(T / Q) + R chunks, a static bound; the chunks past the last are empty). A `lax.scan`
  walks the chunks in order, carrying every row's state [R, H, P, N]: a chunk reads its row's
  state, computes its outputs as the quadratic masked form within the chunk (decays from
  segment sums of dt A) plus the decayed contribution of the state it started from, and
  writes its end state back. A row's chunks are consecutive, so its next chunk starts from
  that state; an empty chunk leaves it unchanged.
`ssd_scan` picks the decode form when every row has at most one token, else the chunked one.
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata, is_decode_only
from vjx.mamba.metadata import MambaRows, mamba_rows

DEFAULT_DT_LIMIT = (0.0, math.inf)


class SsdInputs(NamedTuple):
    """One layer's inputs to the scan, as the mixer hands them over."""

    x_THP: Float[Array, "T H P"]
    dt_TH: Float[Array, "T H"]
    """dt before `dt_bias` and softplus."""
    A_H: Float[Array, " H"]
    B_TGN: Float[Array, "T G N"]
    C_TGN: Float[Array, "T G N"]
    D_H: Float[Array, " H"]
    dt_bias_H: Float[Array, " H"]


class _Discretized(NamedTuple):
    """The recurrence's per-token terms in float32, B and C repeated to heads."""

    dtx_THP: Float[Array, "T H P"]
    """dt x: the input the state takes in (times B)."""
    log_decay_TH: Float[Array, "T H"]
    """dt A: the log of the state's decay over the token."""
    B_THN: Float[Array, "T H N"]
    C_THN: Float[Array, "T H N"]


_Form = Callable[[_Discretized, Float[Array, "R H P N"], MambaRows], tuple[Array, Array]]


def ssd_scan(
    inputs: SsdInputs,
    ssm_state: Float[Array, "R H P N"],
    md: AttentionMetadata,
    *,
    chunk_size: int,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """The recurrence over every row's tokens (y in x's dtype, 0 for padding tokens) and each
    row's final state; the decode form for a step whose rows all have at most one token, the
    chunked form otherwise."""
    chunked = functools.partial(_chunked_form, chunk_size=_checked_chunk_size(chunk_size))

    def either_form(discretized, initial_RHPN, rows):
        return jax.lax.cond(is_decode_only(md), _decode_form, chunked, discretized, initial_RHPN, rows)

    return _run(either_form, inputs, ssm_state, md, dt_limit)


def selective_state_update(
    inputs: SsdInputs,
    ssm_state: Float[Array, "R H P N"],
    md: AttentionMetadata,
    *,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """`ssd_scan`'s decode form: valid only for a step whose rows have at most one token."""
    return _run(_decode_form, inputs, ssm_state, md, dt_limit)


def mamba_chunk_scan_combined(
    inputs: SsdInputs,
    ssm_state: Float[Array, "R H P N"],
    md: AttentionMetadata,
    *,
    chunk_size: int,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """`ssd_scan`'s chunked form, valid for any step."""
    chunked = functools.partial(_chunked_form, chunk_size=_checked_chunk_size(chunk_size))
    return _run(chunked, inputs, ssm_state, md, dt_limit)


def _run(
    form: _Form,
    inputs: SsdInputs,
    ssm_state: Float[Array, "R H P N"],
    md: AttentionMetadata,
    dt_limit: tuple[float, float],
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """Discretizes the inputs, runs `form` from each row's initial state and adds the D skip."""
    x_THP = inputs.x_THP
    _check_shapes(inputs, ssm_state)
    rows = mamba_rows(md, x_THP.shape[0])
    y_THP, final_RHPN = form(_discretize(inputs, dt_limit), ssm_state.astype(jnp.float32), rows)
    y_THP = y_THP + inputs.D_H.astype(jnp.float32)[:, None] * x_THP.astype(jnp.float32)
    y_THP = jnp.where(rows.is_real_token[:, None, None], y_THP, 0.0).astype(x_THP.dtype)
    return y_THP, final_RHPN


def _discretize(inputs: SsdInputs, dt_limit: tuple[float, float]) -> _Discretized:
    """dt = clamp(softplus(dt + dt_bias), dt_limit), then the recurrence's terms in float32."""
    num_heads = inputs.x_THP.shape[1]
    dt_TH = jax.nn.softplus(inputs.dt_TH.astype(jnp.float32) + inputs.dt_bias_H.astype(jnp.float32))
    dt_TH = jnp.clip(dt_TH, *dt_limit)
    heads_per_group = num_heads // inputs.B_TGN.shape[1]
    B_THN, C_THN = (jnp.repeat(v.astype(jnp.float32), heads_per_group, axis=1) for v in (inputs.B_TGN, inputs.C_TGN))
    return _Discretized(
        dtx_THP=dt_TH[..., None] * inputs.x_THP.astype(jnp.float32),
        log_decay_TH=dt_TH * inputs.A_H.astype(jnp.float32),
        B_THN=B_THN,
        C_THN=C_THN,
    )


def _gather(inputs: _Discretized, token: Int[Array, "*M"]) -> _Discretized:
    """The inputs of the given tokens; an index past the end (T) reads zeros: no input, no decay."""
    return _Discretized(*(v.at[token].get(mode="fill", fill_value=0.0) for v in inputs))


def _decode_form(
    inputs: _Discretized, initial_RHPN: Float[Array, "R H P N"], rows: MambaRows
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """One update of each row's state by its token (a row without one keeps its state)."""
    num_tokens = inputs.dtx_THP.shape[0]
    token_R = jnp.where(rows.query_lens > 0, rows.query_start_loc[:-1], num_tokens)
    dtx_RHP, log_decay_RH, B_RHN, C_RHN = _gather(inputs, token_R)
    state_RHPN = jnp.exp(log_decay_RH)[..., None, None] * initial_RHPN
    state_RHPN = state_RHPN + jnp.einsum("rhp,rhn->rhpn", dtx_RHP, B_RHN)
    y_RHP = jnp.einsum("rhpn,rhn->rhp", state_RHPN, C_RHN)
    y_THP = jnp.zeros(inputs.dtx_THP.shape, jnp.float32).at[token_R].set(y_RHP, mode="drop")
    return y_THP, state_RHPN


def _chunked_form(
    inputs: _Discretized, initial_RHPN: Float[Array, "R H P N"], rows: MambaRows, *, chunk_size: int
) -> tuple[Float[Array, "T H P"], Float[Array, "R H P N"]]:
    """Walks the step's chunks in order, carrying every row's state and the output."""
    row_M, token_MQ = _chunk_layout(rows, chunk_size)

    def chunk_step(carry, chunk):
        state_RHPN, y_THP = carry
        row, token_Q = chunk
        y_QHP, state_HPN = _scan_chunk(_gather(inputs, token_Q), state_RHPN[row])
        return (state_RHPN.at[row].set(state_HPN), y_THP.at[token_Q].set(y_QHP, mode="drop")), None

    init = (initial_RHPN, jnp.zeros(inputs.dtx_THP.shape, jnp.float32))
    (final_RHPN, y_THP), _ = jax.lax.scan(chunk_step, init, (row_M, token_MQ))
    return y_THP, final_RHPN


def _chunk_layout(rows: MambaRows, chunk_size: int) -> tuple[Int[Array, " M"], Int[Array, "M Q"]]:
    """Each chunk's row and the tokens at its positions, chunks in row order. Positions past a
    row's last token, and every position of the empty chunks after the last, get token T."""
    num_tokens, num_rows = rows.token_row.shape[0], rows.query_lens.shape[0]
    max_chunks = -(-num_tokens // chunk_size) + num_rows
    num_chunks_R = -(-rows.query_lens // chunk_size)
    chunk_start_loc = jnp.concatenate([jnp.zeros(1, num_chunks_R.dtype), jnp.cumsum(num_chunks_R)])
    chunk = jnp.arange(max_chunks)
    row_M = jnp.minimum(jnp.searchsorted(chunk_start_loc[1:], chunk, side="right"), num_rows - 1)
    offset_MQ = (chunk - chunk_start_loc[row_M])[:, None] * chunk_size + jnp.arange(chunk_size)
    is_in_row = offset_MQ < rows.query_lens[row_M][:, None]
    token_MQ = jnp.where(is_in_row, rows.query_start_loc[row_M][:, None] + offset_MQ, num_tokens)
    return row_M, token_MQ


def _scan_chunk(
    chunk: _Discretized, state_HPN: Float[Array, "H P N"]
) -> tuple[Float[Array, "Q H P"], Float[Array, "H P N"]]:
    """One chunk's outputs (without the D skip) and end state, from the state it starts from:
    y_l = sum_{s <= l} exp(A_{s+1..l}) (C_l . B_s) dt_s x_s + exp(A_{1..l}) C_l h_in, and
    h_out = exp(A_{1..Q}) h_in + sum_s exp(A_{s+1..Q}) dt_s x_s B_s^T, with A_{i..j} the sum
    of dt A over positions i..j."""
    dtx_QHP, log_decay_QH, B_QHN, C_QHN = chunk
    decay_HLQ = jnp.exp(_segment_sum(log_decay_QH))
    scores_HLQ = jnp.einsum("lhn,qhn->hlq", C_QHN, B_QHN) * decay_HLQ
    y_QHP = jnp.einsum("hlq,qhp->lhp", scores_HLQ, dtx_QHP)
    decay_in_QH = jnp.exp(jnp.cumsum(log_decay_QH, axis=0))
    y_QHP = y_QHP + decay_in_QH[..., None] * jnp.einsum("lhn,hpn->lhp", C_QHN, state_HPN)
    decay_out_QH = decay_HLQ[:, -1, :].T
    state_HPN = decay_in_QH[-1][:, None, None] * state_HPN
    state_HPN = state_HPN + jnp.einsum("qhp,qhn->hpn", decay_out_QH[..., None] * dtx_QHP, B_QHN)
    return y_QHP, state_HPN


def _segment_sum(log_decay_QH: Float[Array, "Q H"]) -> Float[Array, "H L Q"]:
    """[h, l, q] = the sum of log_decay over positions q+1..l for q <= l, -inf above the
    diagonal; summed directly rather than as a difference of cumulative sums, which would
    cancel in float32."""
    num_positions = log_decay_QH.shape[0]
    position = jnp.arange(num_positions)
    is_after_q = position[:, None] > position[None, :]
    terms_HLQ = jnp.where(is_after_q, log_decay_QH.T[:, :, None], 0.0)
    sums_HLQ = jnp.cumsum(terms_HLQ, axis=1)
    return jnp.where(position[:, None] >= position[None, :], sums_HLQ, -jnp.inf)


def _checked_chunk_size(chunk_size: int) -> int:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    return chunk_size


def _check_shapes(inputs: SsdInputs, ssm_state: Array) -> None:
    num_tokens, num_heads, head_dim = inputs.x_THP.shape
    num_groups, state_dim = inputs.B_TGN.shape[1:]
    if num_heads % num_groups:
        raise ValueError(f"the heads ({num_heads}) must be a multiple of the groups of B and C ({num_groups}).")
    if ssm_state.shape[1:] != (num_heads, head_dim, state_dim):
        raise ValueError(
            f"ssm_state must be [R, {num_heads}, {head_dim}, {state_dim}] (rows, heads, head dim, state dim), "
            f"got {ssm_state.shape}."
        )
