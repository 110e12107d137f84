"""FP8 (float8_e4m3fn), vLLM's `fp8` and `ptpc_fp8`.

At load (`quantization="fp8"` or `"ptpc_fp8"` on a bf16 checkpoint), every linear weight but
the LM head is quantized to FP8 with one scale per tensor ("fp8") or per output channel
("ptpc_fp8"); activations are quantized per token as they come (dynamic W8A8; vLLM's "fp8"
uses one dynamic scale per batch instead, which makes a request's output depend on its
neighbours). A checkpoint whose `quantization_config` says `quant_method: "fp8"` is already
FP8: per tensor with dynamic or static activation scales, or block-wise (`weight_block_size`,
scales `weight_scale_inv` per 128x128 block, as DeepSeek and Qwen FP8 checkpoints ship).

MoE experts quantized at load store FP8 weights with a scale per expert and output channel
("ptpc_fp8") or per expert and projection ("fp8", as vLLM's per-expert scales); the grouped
GEMMs take the activations in the model dtype (W8A16, as vLLM runs FP8 experts on GPUs
without FP8 tensor cores). Block-wise FP8 MoE checkpoints keep their experts in FP8
(vjx/quantization/fp8_moe.py); per-tensor FP8 MoE checkpoints are not loaded yet and are
refused.

A layer whose kernel the model reads as a plain array instead of calling the layer
(`DEQUANTIZE_AT_LOAD`: MLA's kv_b_proj, whose halves are W_UK and W_UV) is never quantized
at load, and a block-wise checkpoint's FP8 kernel is dequantized to the model dtype as it
loads (as vLLM's MLA does).
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.param import logical_axes_of, logical_param
from vjx.quantization.base import (
    FusedMoEMethod,
    LinearMethod,
    QuantizationConfig,
    UnquantizedLinearMethod,
    abstract_param,
    add_bias,
    flat_shapes,
    is_layer_skipped,
    out_axes,
)
from vjx.quantization.fp8_moe import BlockFp8MoEMethod
from vjx.quantization.w8a8 import FP8_DTYPE, MIN_SCALE, W8A8LinearMethod, quant_max, quantize, w8a8_matmul

ACTIVATION_SCHEMES = ("dynamic", "static")


class Fp8Config(QuantizationConfig):
    """FP8 linear layers; the LM head stays unquantized, as in vLLM."""

    def __init__(
        self,
        *,
        per_channel: bool = False,
        is_checkpoint_fp8_serialized: bool = False,
        activation_scheme: str = "dynamic",
        weight_block_size: tuple[int, int] | None = None,
        ignored_layers: Sequence[str] = (),
    ):
        self.per_channel = per_channel
        self.is_checkpoint_fp8_serialized = is_checkpoint_fp8_serialized
        self.activation_scheme = activation_scheme
        self.weight_block_size = weight_block_size
        self.ignored_layers = tuple(ignored_layers)

    @classmethod
    def get_name(cls) -> str:
        return "fp8"

    @classmethod
    def from_config(cls, config: dict) -> "Fp8Config":
        activation_scheme = config.get("activation_scheme", "dynamic")
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ValueError(f"activation_scheme must be one of {ACTIVATION_SCHEMES}, got {activation_scheme!r}.")
        block = config.get("weight_block_size")
        if block is not None and (len(block) != 2 or activation_scheme != "dynamic"):
            raise ValueError(f"block-wise FP8 takes weight_block_size [n, k] and dynamic activations, got {config}.")
        ignored = config.get("ignored_layers") or config.get("modules_to_not_convert") or ()
        return cls(
            is_checkpoint_fp8_serialized=True,
            activation_scheme=activation_scheme,
            weight_block_size=tuple(block) if block is not None else None,
            ignored_layers=ignored,
        )

    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        if prefix == "lm_head" or is_layer_skipped(layer, prefix, self.ignored_layers):
            return None
        if getattr(layer, "DEQUANTIZE_AT_LOAD", False):
            return self._dequantized_method(prefix)
        if not self.is_checkpoint_fp8_serialized:
            return Fp8OnlineLinearMethod(self.per_channel)
        if self.weight_block_size is not None:
            return BlockFp8LinearMethod(self.weight_block_size, "weight_scale_inv")
        return W8A8LinearMethod("float8_e4m3fn", static_input_scale=self.activation_scheme == "static")

    def _dequantized_method(self, prefix: str) -> LinearMethod | None:
        """The method of a `DEQUANTIZE_AT_LOAD` layer: none at load (the kernel stays in the
        model dtype), a block-wise checkpoint's dequantized as it loads."""
        if not self.is_checkpoint_fp8_serialized:
            return None
        if self.weight_block_size is None:
            raise ValueError(
                f"{prefix} is read as a plain kernel, which vjx dequantizes at load from block-wise FP8 checkpoints "
                "(weight_block_size) only; this checkpoint is FP8 per tensor."
            )
        return DequantizedBlockFp8LinearMethod(self.weight_block_size, "weight_scale_inv")

    def get_moe_method(self, layer: nnx.Module, prefix: str) -> FusedMoEMethod | None:
        if not self.is_checkpoint_fp8_serialized:
            return Fp8OnlineMoEMethod(self.per_channel)
        if self.weight_block_size is None:
            raise ValueError(
                f"FP8 checkpoints of MoE models are not loaded by vjx per tensor, only block-wise (weight_block_size) "
                f"({prefix}); load the bf16 checkpoint with quantization='fp8' to store the experts in FP8."
            )
        return BlockFp8MoEMethod(self.weight_block_size)


class PtpcFp8Config(Fp8Config):
    """vLLM's `ptpc_fp8`: FP8 at load with a scale per output channel and per token."""

    def __init__(self):
        super().__init__(per_channel=True)

    @classmethod
    def get_name(cls) -> str:
        return "ptpc_fp8"

    @classmethod
    def from_config(cls, config: dict) -> "Fp8Config":
        raise ValueError("ptpc_fp8 quantizes at load; an FP8 checkpoint says quant_method 'fp8'.")


@dataclasses.dataclass(frozen=True)
class Fp8OnlineLinearMethod(LinearMethod):
    """Loads the model-dtype kernel, then stores it as float8_e4m3fn with a float32 scale
    per output channel (`per_channel`) or one per tensor, repeated over the channels."""

    per_channel: bool

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        axes = logical_axes_of(layer.kernel)
        quantize_fn = _quantize_fn(layer.num_in_dims, self.per_channel, sharding_of(axes), sharding_of(out_axes(layer)))
        kernel, scale = quantize_fn(layer.kernel[...])
        layer.kernel = logical_param(kernel, axes)
        layer.weight_scale = logical_param(scale, out_axes(layer))

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        return w8a8_matmul(layer, x, FP8_DTYPE)


@dataclasses.dataclass(frozen=True)
class Fp8OnlineMoEMethod(FusedMoEMethod):
    """Loads the experts in the model dtype, then stores w13 and w2 as float8_e4m3fn with
    float32 scales w13_scale [E, 2, F] and w2_scale [E, D]: one per output channel
    (`per_channel`), else one per expert and projection repeated over its channels."""

    per_channel: bool

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        for attr, scale_axes in (("w13", (0, 2, 3)), ("w2", (0, 2))):
            param = getattr(layer, attr)
            axes = logical_axes_of(param)
            scale_logical = tuple(axes[i] for i in scale_axes)
            quantize_fn = _quantize_experts_fn(self.per_channel, sharding_of(axes), sharding_of(scale_logical))
            weight, scale = quantize_fn(param[...])
            setattr(layer, attr, logical_param(weight, axes))
            setattr(layer, f"{attr}_scale", logical_param(scale, scale_logical))


@functools.cache
def _quantize_experts_fn(per_channel: bool, weight_sharding, scale_sharding):
    """Expert weights [E, in, *out] -> (FP8 values, float32 scales [E, *out]), on the devices."""

    def quantize_experts(weight):
        w = weight.astype(jnp.float32)
        absmax = jnp.max(jnp.abs(w), axis=1)
        if not per_channel:
            per_expert = jnp.max(absmax, axis=-1, keepdims=True)
            absmax = jnp.broadcast_to(per_expert, absmax.shape)
        scale = jnp.maximum(absmax, MIN_SCALE) / quant_max(FP8_DTYPE)
        return quantize(w, scale[:, None], FP8_DTYPE), scale

    return jax.jit(quantize_experts, out_shardings=(weight_sharding, scale_sharding))


@functools.cache
def _quantize_fn(num_in_dims: int, per_channel: bool, kernel_sharding, scale_sharding):
    """kernel -> (its FP8 values, the float32 scale of each output channel), on the devices."""

    def quantize_kernel(kernel):
        w = kernel.astype(jnp.float32)
        absmax = jnp.max(jnp.abs(w), axis=tuple(range(num_in_dims)))
        if not per_channel:
            absmax = jnp.full_like(absmax, jnp.max(absmax))
        scale = jnp.maximum(absmax, MIN_SCALE) / quant_max(FP8_DTYPE)
        return quantize(w, scale, FP8_DTYPE), scale

    return jax.jit(quantize_kernel, out_shardings=(kernel_sharding, scale_sharding))


@dataclasses.dataclass(frozen=True)
class BlockFp8LinearMethod(LinearMethod):
    """An FP8 kernel with one scale per (n, k) = (output rows, input columns) block of the
    checkpoint's weight [out, in], under the tensor name `scale_name`.

    The scales are stored per input block and output channel, [in / k, *output dims] (each
    block's scale repeated over its n rows), which lays out through fused layers like any
    per-channel value. The matmul dequantizes the kernel block by block to the activations'
    dtype; the FP8 GEMM with per-token-group activation scales is the GPU issue's."""

    block_size: tuple[int, int]
    scale_name: str

    @property
    def HF_NAMES(self) -> dict[str, str]:
        return {"weight": "kernel", self.scale_name: "weight_scale"}

    def create_weights(self, layer: nnx.Module) -> None:
        in_shape, _ = flat_shapes(layer)
        num_in = int(np.prod(in_shape))
        block_in = self.block_size[1]
        if num_in % block_in:
            raise ValueError(
                f"a block-wise FP8 layer's input size ({num_in}) must be a multiple of its block size {block_in}."
            )
        axes = logical_axes_of(layer.kernel)
        layer.kernel = abstract_param(layer.kernel.shape, FP8_DTYPE, axes)
        layer.weight_scale = abstract_param(
            (num_in // block_in, *layer.out_shape), jnp.float32, (axes[0], *out_axes(layer))
        )

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        if attr != "weight_scale":
            return super().to_param_layout(layer, attr, tensors)
        block_out = self.block_size[0]
        rows = [
            np.repeat(np.asarray(tensor, np.float32), block_out, axis=0)[:width]
            for tensor, width in zip(tensors, layer.part_widths(), strict=True)
        ]
        return layer.lay_out(rows, (rows[0].shape[1],))

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        in_shape, out_shape = flat_shapes(layer)
        batch_shape = x.shape[: x.ndim - len(in_shape)]
        x_BI = x.reshape(-1, int(np.prod(in_shape)))
        scale_GO = layer.weight_scale[...].reshape(layer.weight_scale.shape[0], 1, -1)
        w_GKO = layer.kernel[...].reshape(scale_GO.shape[0], -1, scale_GO.shape[2]).astype(jnp.float32) * scale_GO
        y_BO = jnp.dot(x_BI, w_GKO.reshape(x_BI.shape[1], -1).astype(x.dtype))
        return add_bias(layer, y_BO.reshape(*batch_shape, *out_shape))


@dataclasses.dataclass(frozen=True)
class DequantizedBlockFp8LinearMethod(BlockFp8LinearMethod):
    """Loads a block-wise FP8 kernel and its scales, then stores the kernel dequantized in the
    model dtype (the loader casts the FP8 values to it exactly; the scales are dropped): for a
    layer the model reads as a plain kernel."""

    def create_weights(self, layer: nnx.Module) -> None:
        model_dtype, axes = layer.kernel.dtype, logical_axes_of(layer.kernel)
        super().create_weights(layer)
        layer.kernel = abstract_param(layer.kernel.shape, model_dtype, axes)

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        axes = logical_axes_of(layer.kernel)
        kernel = _dequantize_fn(sharding_of(axes))(layer.kernel[...], layer.weight_scale[...])
        layer.kernel = logical_param(kernel, axes)
        layer.weight_scale = None

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        return UnquantizedLinearMethod().apply(layer, x)


@functools.cache
def _dequantize_fn(kernel_sharding):
    """(kernel [*in, *out], scales [in / k, *out]) -> each block of k input rows times its
    scale, in the kernel's dtype, on the devices."""

    def dequantize(kernel, scale):
        scale_GO = scale.reshape(scale.shape[0], 1, -1)
        w_GKO = kernel.reshape(scale_GO.shape[0], -1, scale_GO.shape[2]).astype(jnp.float32) * scale_GO
        return w_GKO.reshape(kernel.shape).astype(kernel.dtype)

    return jax.jit(dequantize, out_shardings=kernel_sharding)
