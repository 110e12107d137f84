"""RMSNorm with Hugging Face's numerics: normalize in float32, scale in the model dtype."""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.param import HFParamLayer, logical_param


class RMSNorm(nnx.Module, HFParamLayer):
    """x / rms(x) * weight over the last dimension; the weight's axis is `norm` (replicated)."""

    HF_NAMES = {"weight": "weight"}

    def __init__(self, num_features: int, *, eps: float, dtype: jnp.dtype):
        self.eps = eps
        self.weight = logical_param(jnp.ones((num_features,), dtype), ("norm",))

    def __call__(self, x: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        normed = (x32 * jax.lax.rsqrt(variance + self.eps)).astype(x.dtype)
        return self.weight[...] * normed
