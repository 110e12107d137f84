"""`quantization="fp8"`: a bf16 checkpoint's linear weights quantized at load to
float8_e4m3fn with one scale per output channel, activations quantized per token as they come
(dynamic W8A8), as vLLM's online FP8.

The matmul multiplies the two FP8 operands with float32 accumulation and scales the result by
the token's and the channel's scales: on Hopper, XLA lowers this pattern to an FP8 GEMM; on CPU
the same program runs as is.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.param import logical_axes_of, logical_param
from vjx.quantization.base import LinearMethod, QuantizationConfig, add_bias, flat_shapes

FP8_DTYPE = jnp.float8_e4m3fn
FP8_MAX = float(jnp.finfo(FP8_DTYPE).max)
_MIN_SCALE = 1e-12
"""Floor of a scale, so that an all-zero row or channel quantizes to zeros, not NaNs."""


class Fp8Config(QuantizationConfig):
    """Every linear layer but the LM head in FP8 (vLLM leaves the LM head unquantized)."""

    @classmethod
    def get_name(cls) -> str:
        return "fp8"

    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        return None if prefix == "lm_head" else Fp8LinearMethod()


@dataclasses.dataclass(frozen=True)
class Fp8LinearMethod(LinearMethod):
    """kernel: float8_e4m3fn in the layer's layout; weight_scale: float32 per output channel."""

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        axes = logical_axes_of(layer.kernel)
        out_axes = axes[layer.num_in_dims :]
        quantize = _quantize_fn(layer.num_in_dims, sharding_of(axes), sharding_of(out_axes))
        kernel, scale = quantize(layer.kernel[...])
        layer.kernel = logical_param(kernel, axes)
        layer.weight_scale = logical_param(scale, out_axes)

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        in_shape, out_shape = flat_shapes(layer)
        batch_shape = x.shape[: x.ndim - len(in_shape)]
        x_BI = x.reshape(-1, int(np.prod(in_shape)))
        x_scale_B1 = jnp.maximum(jnp.max(jnp.abs(x_BI), axis=-1, keepdims=True).astype(jnp.float32), _MIN_SCALE)
        x_scale_B1 = x_scale_B1 / FP8_MAX
        xq_BI = jnp.clip(x_BI / x_scale_B1, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)
        w_IO = layer.kernel[...].reshape(xq_BI.shape[1], -1)
        y_BO = jnp.dot(xq_BI, w_IO, preferred_element_type=jnp.float32)
        y_BO = y_BO * x_scale_B1 * layer.weight_scale[...].reshape(1, -1)
        return add_bias(layer, y_BO.astype(x.dtype).reshape(*batch_shape, *out_shape))


@functools.cache
def _quantize_fn(num_in_dims: int, kernel_sharding, scale_sharding):
    """kernel -> (its FP8 values, the float32 scale of each output channel), on the devices."""

    def quantize(kernel):
        w = kernel.astype(jnp.float32)
        absmax = jnp.max(jnp.abs(w), axis=tuple(range(num_in_dims)))
        scale = jnp.maximum(absmax, _MIN_SCALE) / FP8_MAX
        return jnp.clip(w / scale, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE), scale

    return jax.jit(quantize, out_shardings=(kernel_sharding, scale_sharding))
