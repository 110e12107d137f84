"""Block-wise FP8 MoE experts, as DeepSeek-V3/R1 and Qwen's FP8 MoE checkpoints ship them.

Each expert projection `experts.{e}.{gate,up,down}_proj` is stored like a block-wise FP8
linear layer (vjx/quantization/fp8.py's `BlockFp8LinearMethod`): `weight` float8_e4m3fn
[out, in] and `weight_scale_inv` float32 [ceil(out / n), ceil(in / k)], the dequantized
weight being each (n, k) block times its scale.

vjx keeps the experts in FP8 (one byte a weight, as the checkpoint): w13 [E, D, 2, F] and w2
[E, F, D] in float8_e4m3fn beside `w13_scale_inv` [E, D / k, 2, F] and `w2_scale_inv`
[E, F / k, D], one scale per input block and output channel (each block's scale repeated over
its n rows, so the scales split over devices like the weights). The grouped GEMMs dequantize
the experts block by block to the activations' dtype as they read them (W8A16, like
`Fp8OnlineMoEMethod`'s experts); an FP8 grouped GEMM with per-token-group activation scales
is not built yet.
"""

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from vjx.models.layers.param import HFTensor, logical_axes_of
from vjx.quantization.base import FusedMoEMethod, abstract_param
from vjx.quantization.w8a8 import FP8_DTYPE

SCALE_SUFFIX = "_scale_inv"
"""A weight param's scales are the param of its name plus this suffix (w13_scale_inv)."""


@dataclasses.dataclass(frozen=True)
class BlockFp8MoEMethod(FusedMoEMethod):
    """FP8 expert weights with one scale per (n, k) = `block_size` block of each expert's
    [out, in] weight, read from `weight` and `weight_scale_inv` (see the module docstring)."""

    block_size: tuple[int, int]

    def create_weights(self, layer: nnx.Module) -> None:
        block_in = self.block_size[1]
        for attr in ("w13", "w2"):
            param = getattr(layer, attr)
            axes = logical_axes_of(param)
            num_in = param.shape[1]
            if num_in % block_in:
                raise ValueError(
                    f"block-wise FP8 experts need input sizes that are multiples of the block size {block_in}, "
                    f"got {num_in} ({attr})."
                )
            setattr(layer, attr, abstract_param(param.shape, FP8_DTYPE, axes))
            scale_shape = (param.shape[0], num_in // block_in, *param.shape[2:])
            setattr(layer, attr + SCALE_SUFFIX, abstract_param(scale_shape, jnp.float32, axes))

    def hf_tensors(self, layer: nnx.Module, tensors: dict[str, HFTensor]) -> dict[str, HFTensor]:
        """Each expert weight's tensor and, beside it, its `weight_scale_inv`."""
        with_scales = dict(tensors)
        for name, tensor in tensors.items():
            if tensor.attr not in ("w13", "w2"):
                continue
            if not name.endswith(".weight"):
                raise ValueError(f"block-wise FP8 experts are read from per-expert weights, not from {name}.")
            scale = HFTensor(tensor.attr + SCALE_SUFFIX, tensor.part, tensor.num_parts)
            with_scales[f"{name.removesuffix('.weight')}.weight_scale_inv"] = scale
        return with_scales

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        if not attr.endswith(SCALE_SUFFIX):
            return layer.checkpoint_layout(attr, tensors)
        weight_attr = attr.removesuffix(SCALE_SUFFIX)
        out_rows = getattr(layer, weight_attr).shape[-1]  # each part's: F (gate, up) or D (down)
        block_out = self.block_size[0]
        rows = [np.repeat(np.asarray(tensor, np.float32), block_out, axis=0)[:out_rows] for tensor in tensors]
        return layer.checkpoint_layout(weight_attr, rows)
