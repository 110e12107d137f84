"""Mamba2's gated RMS norm (`Mamba2RMSNormGated`, norm_before_gate=False), in pure jnp.

Legend: T tokens (any leading dims), I the mixer's inner width (heads x head dim), G norm
groups of `group_size` channels (I = G * group_size; Mamba2 checkpoints take
`intermediate_size // n_groups`, one norm group per group of B and C).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def rms_norm_gated(
    x_TI: Float[Array, "*T I"],
    z_TI: Float[Array, "*T I"],
    weight_I: Float[Array, " I"],
    *,
    group_size: int,
    eps: float,
) -> Float[Array, "*T I"]:
    """x * silu(z), RMS-normalized within each group of `group_size` channels, times `weight`;
    in float32 (the weight product too, as vLLM's kernel does), cast back to x's dtype."""
    width = x_TI.shape[-1]
    if group_size < 1 or width % group_size:
        raise ValueError(f"group_size must divide the inner width {width}, got {group_size}.")
    gated_TI = x_TI.astype(jnp.float32) * jax.nn.silu(z_TI.astype(jnp.float32))
    gated_TGI = gated_TI.reshape(*gated_TI.shape[:-1], width // group_size, group_size)
    variance_TG = jnp.mean(jnp.square(gated_TGI), axis=-1, keepdims=True)
    normed_TI = (gated_TGI * jax.lax.rsqrt(variance_TG + eps)).reshape(gated_TI.shape)
    return (normed_TI * weight_I.astype(jnp.float32)).astype(x_TI.dtype)
