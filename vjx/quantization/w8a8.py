"""8-bit weights and activations (W8A8), in FP8 (float8_e4m3fn) or INT8.

The kernel is stored in 8 bits in the layer's layout, with one float32 scale per output
channel (a checkpoint's per-tensor scale is repeated over its channels, which multiplies the
same values). Activations are quantized as they come: dynamically per token, or statically
with the checkpoint's per-tensor `input_scale`. The matmul multiplies the two 8-bit operands
with a wide accumulator (float32 for FP8, int32 for INT8) and scales the result by the token's
and the channel's scales: on Hopper, XLA lowers this pattern to an FP8 (or INT8) GEMM; on CPU
the same program runs as is.
"""

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.param import logical_axes_of
from vjx.quantization.base import LinearMethod, abstract_param, add_bias, flat_shapes, out_axes, per_output

FP8_DTYPE = jnp.float8_e4m3fn
QUANT_DTYPES = {"float8_e4m3fn": FP8_DTYPE, "int8": jnp.int8}
MIN_SCALE = 1e-12
"""Floor of a scale, so that an all-zero row or channel quantizes to zeros, not NaNs."""


def quant_max(dtype) -> float:
    """The largest magnitude `dtype` holds (448 for float8_e4m3fn, 127 for int8)."""
    dtype = jnp.dtype(dtype)
    return float(jnp.iinfo(dtype).max if jnp.issubdtype(dtype, jnp.integer) else jnp.finfo(dtype).max)


def quantize(x: Float[Array, "..."], scale: Float[Array, "..."], dtype) -> Array:
    """x / scale in `dtype`: clipped to its range, rounded to the nearest integer for INT8."""
    q = x.astype(jnp.float32) / scale
    if jnp.issubdtype(jnp.dtype(dtype), jnp.integer):
        q = jnp.round(q)
    return jnp.clip(q, -quant_max(dtype), quant_max(dtype)).astype(dtype)


@dataclasses.dataclass(frozen=True)
class W8A8LinearMethod(LinearMethod):
    """A checkpoint's 8-bit kernel `weight` with its `weight_scale` (per tensor or per output
    channel), and, when `static_input_scale`, the per-tensor `input_scale` of its activations
    (a fused layer takes the largest of its parts', as vLLM does)."""

    quant_dtype: str
    static_input_scale: bool

    @property
    def HF_NAMES(self) -> dict[str, str]:
        names = {"weight": "kernel", "weight_scale": "weight_scale"}
        return {**names, "input_scale": "input_scale"} if self.static_input_scale else names

    def create_weights(self, layer: nnx.Module) -> None:
        layer.kernel = abstract_param(layer.kernel.shape, QUANT_DTYPES[self.quant_dtype], logical_axes_of(layer.kernel))
        layer.weight_scale = abstract_param(layer.out_shape, jnp.float32, out_axes(layer))
        if self.static_input_scale:
            layer.input_scale = abstract_param((), jnp.float32, ())

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        if attr == "weight_scale":
            return layer.lay_out(per_output(layer, tensors))
        if attr == "input_scale":
            return np.asarray(max(float(np.asarray(tensor).reshape(())) for tensor in tensors), np.float32)
        return super().to_param_layout(layer, attr, tensors)

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        input_scale = layer.input_scale[...] if self.static_input_scale else None
        return w8a8_matmul(layer, x, QUANT_DTYPES[self.quant_dtype], input_scale)


def w8a8_matmul(layer: nnx.Module, x: Float[Array, "..."], dtype, input_scale=None) -> Float[Array, "..."]:
    """x @ kernel with x quantized to `dtype` per token (or by the static `input_scale`)."""
    in_shape, out_shape = flat_shapes(layer)
    batch_shape = x.shape[: x.ndim - len(in_shape)]
    x_BI = x.reshape(-1, int(np.prod(in_shape)))
    if input_scale is None:
        absmax_B1 = jnp.max(jnp.abs(x_BI), axis=-1, keepdims=True).astype(jnp.float32)
        x_scale = jnp.maximum(absmax_B1, MIN_SCALE) / quant_max(dtype)
    else:
        x_scale = input_scale
    xq_BI = quantize(x_BI, x_scale, dtype)
    w_IO = layer.kernel[...].reshape(xq_BI.shape[1], -1)
    accumulator = jnp.int32 if jnp.issubdtype(jnp.dtype(dtype), jnp.integer) else jnp.float32
    y_BO = jnp.dot(xq_BI, w_IO, preferred_element_type=accumulator).astype(jnp.float32)
    y_BO = y_BO * x_scale * layer.weight_scale[...].reshape(1, -1)
    return add_bias(layer, y_BO.astype(x.dtype).reshape(*batch_shape, *out_shape))
