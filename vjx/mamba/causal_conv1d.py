"""The Mamba mixer's depthwise causal convolution over one ragged step, in pure jnp.

Legend: T tokens in the padded batch, R request rows, C conv channels, K kernel width (taps),
M the positions a window is gathered for (tokens or rows), W window width.

Weight layout: `weight_KC [K, C]`, taps first, channels last like the activations; tap K-1
multiplies the token itself and tap 0 its input K-1 tokens back. From transformers' `Conv1d`
weight `[C, 1, K]` (and vLLM's squeezed `[C, K]`) it is `weight[:, 0, :].T`: torch's conv1d
is a cross-correlation, so with K-1 zeros of left padding its last tap is the current token.

Conv state layout: `conv_state [R, K-1, C]` holds each row's last K-1 conv inputs before the
step, oldest first: the layer gathers them from the row's state slot, and gives zeros for a
row that starts afresh (`MambaRows.initial_states`). Token i of a row sees the row's K-1
inputs before it: earlier tokens of this step, else the tail of that state. The row's new
state is the last K-1 of (old state, its step's tokens), so a step shorter than K-1 tokens
keeps part of the old state; the layer writes it back to the slot (`MambaRows.write_states`).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.mamba.metadata import MambaRows, mamba_rows

ACTIVATIONS = (None, "silu")


def causal_conv1d(
    x_TC: Float[Array, "T C"],
    weight_KC: Float[Array, "K C"],
    bias_C: Float[Array, " C"] | None,
    conv_state: Float[Array, "R K-1 C"],
    md: AttentionMetadata,
    *,
    activation: str | None,
) -> tuple[Float[Array, "T C"], Float[Array, "R K-1 C"]]:
    """Convolves each row's tokens with their K-1 predecessors (then adds the bias and applies
    `activation`, None or "silu"), in float32; padding tokens get 0. Returns the output in x's
    dtype and each row's last K-1 inputs after the step (float32)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")
    _check_shapes(x_TC, weight_KC, conv_state)
    rows = mamba_rows(md, x_TC.shape[0])
    initial_RWC = conv_state.astype(jnp.float32)
    window_TKC = _inputs_before(x_TC, initial_RWC, rows, rows.token_row, rows.token_offset + 1)
    y_TC = jnp.einsum("tkc,kc->tc", window_TKC.astype(jnp.float32), weight_KC.astype(jnp.float32))
    if bias_C is not None:
        y_TC = y_TC + bias_C.astype(jnp.float32)
    if activation == "silu":
        y_TC = jax.nn.silu(y_TC)
    y_TC = jnp.where(rows.is_real_token[:, None], y_TC, 0.0).astype(x_TC.dtype)
    row_R = jnp.arange(rows.query_lens.shape[0])
    new_RWC = _inputs_before(x_TC, initial_RWC, rows, row_R, rows.query_lens)[:, 1:]
    return y_TC, new_RWC.astype(jnp.float32)


def _inputs_before(
    x_TC: Float[Array, "T C"],
    initial_RWC: Float[Array, "R W C"],
    rows: MambaRows,
    row_M: Int[Array, " M"],
    end_M: Int[Array, " M"],
) -> Float[Array, "M W+1 C"]:
    """The W + 1 conv inputs of row `row_M[m]` ending just before its step offset `end_M[m]`
    (W = K-1): the step's own tokens where the offset is >= 0, else the row's initial state
    (its stored state or zeros), whose last entry is offset -1."""
    num_tokens, width = x_TC.shape[0], initial_RWC.shape[1]
    offset_MW = end_M[:, None] - (width + 1) + jnp.arange(width + 1)
    token_MW = jnp.clip(rows.query_start_loc[row_M][:, None] + offset_MW, 0, num_tokens - 1)
    stored_MWC = initial_RWC[row_M[:, None], jnp.clip(width + offset_MW, 0, width - 1)]
    return jnp.where((offset_MW >= 0)[..., None], x_TC[token_MW], stored_MWC.astype(x_TC.dtype))


def _check_shapes(x_TC: Array, weight_KC: Array, conv_state: Array) -> None:
    num_taps, num_channels = weight_KC.shape
    if num_taps < 2 or x_TC.shape[1] != num_channels:
        raise ValueError(
            f"weight_KC must be [K, C] with K >= 2 and C = {x_TC.shape[1]} (x's channels), got {weight_KC.shape}."
        )
    if conv_state.shape[1:] != (num_taps - 1, num_channels):
        raise ValueError(f"conv_state must be [R, {num_taps - 1}, {num_channels}], got {conv_state.shape}.")
