"""RMSNorms with Hugging Face's numerics.

`RMSNorm` (Llama, Qwen, OLMo 2, ...) normalizes in float32 and scales in the model dtype;
`GemmaRMSNorm` stores the scale as an offset from one and applies it in float32 before
casting back, as Gemma's reference does.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.param import HFParamLayer, logical_param


def _normalize(x32: Float[Array, "*B D"], eps: float, num_axes: int) -> Float[Array, "*B D"]:
    axes = tuple(range(-num_axes, 0))
    variance = jnp.mean(jnp.square(x32), axis=axes, keepdims=True)
    return x32 * jax.lax.rsqrt(variance + eps)


class RMSNorm(nnx.Module, HFParamLayer):
    """x / rms(x) * weight over the trailing dimensions of `shape`, named by `logical_axes`
    (the last dimension, replicated, unless a norm spans several heads)."""

    HF_NAMES = {"weight": "weight"}

    def __init__(
        self,
        num_features: int,
        *,
        eps: float,
        dtype: jnp.dtype,
        shape: tuple[int, ...] | None = None,
        logical_axes: tuple[str | None, ...] = ("norm",),
    ):
        self.eps = eps
        self.weight = logical_param(jnp.ones(shape or (num_features,), dtype), logical_axes)

    def __call__(self, x: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
        normed = _normalize(x.astype(jnp.float32), self.eps, self.weight.ndim).astype(x.dtype)
        return self.weight[...] * normed


class GemmaRMSNorm(nnx.Module, HFParamLayer):
    """x / rms(x) * (1 + weight), all in float32, then cast to the input dtype."""

    HF_NAMES = {"weight": "weight"}

    def __init__(self, num_features: int, *, eps: float, dtype: jnp.dtype):
        self.eps = eps
        self.weight = logical_param(jnp.zeros((num_features,), dtype), ("norm",))

    def __call__(self, x: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
        normed = _normalize(x.astype(jnp.float32), self.eps, 1)
        return (normed * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
