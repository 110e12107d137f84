"""MXFP4, vLLM's `mxfp4`: the MoE experts of OpenAI's gpt-oss checkpoints.

Each expert projection `{name}` is stored as `{name}_blocks` [E, out, in / 32, 16] (uint8,
two FP4 E2M1 values a byte, the low nibble first) and `{name}_scales` [E, out, in / 32]
(uint8 E8M0: the block of 32 values is multiplied by 2 ** (scale - 127)). Everything else
(attention, router, embeddings) is in the model dtype.

vjx dequantizes the experts at load into the model dtype (the checkpoint's [E, in, out]
tensor, which the layer then lays out as if unquantized), so they take four times the memory
MXFP4 would; an MXFP4 grouped GEMM (W4A16) is not built yet.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from flax import nnx

from vjx.models.layers.param import HFTensor
from vjx.quantization.base import FusedMoEMethod, LinearMethod, QuantizationConfig

FP4_E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32
)
"""The value of each 4-bit E2M1 code."""
SCALE_BIAS = 127
BLOCK = 32
"""Values a scale covers."""


class Mxfp4Config(QuantizationConfig):
    """A checkpoint with MXFP4 experts; its linear layers stay unquantized."""

    @classmethod
    def get_name(cls) -> str:
        return "mxfp4"

    @classmethod
    def from_config(cls, config: dict) -> "Mxfp4Config":
        return cls()

    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        return None

    def get_moe_method(self, layer: nnx.Module, prefix: str) -> FusedMoEMethod | None:
        return Mxfp4MoEMethod()


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks [..., out, in / 32, 16] and scales [..., out, in / 32] -> float32 [..., in, out]."""
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}.")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] * 2 != BLOCK:
        raise ValueError(
            f"MXFP4 blocks [..., G, {BLOCK // 2}] need scales [..., G], got {blocks.shape} and {scales.shape}."
        )
    values = np.empty((*blocks.shape[:-1], BLOCK), np.float32)
    values[..., 0::2] = FP4_E2M1_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_E2M1_VALUES[blocks >> 4]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - SCALE_BIAS)
    return np.swapaxes(values.reshape(*scales.shape[:-1], -1), -1, -2)


@dataclasses.dataclass(frozen=True)
class Mxfp4MoEMethod(FusedMoEMethod):
    """Expert weights read from `_blocks` and `_scales` and dequantized at load (biases are
    stored unquantized)."""

    def hf_tensors(self, layer: nnx.Module, tensors: dict[str, HFTensor]) -> dict[str, HFTensor]:
        renamed = {}
        for name, tensor in tensors.items():
            if tensor.attr not in ("w13", "w2"):
                renamed[name] = tensor
                continue
            if tensor.num_parts != 1:
                raise ValueError(f"MXFP4 experts are read from fused expert tensors, not per-expert ones ({name}).")
            renamed[f"{name}_blocks"] = HFTensor(tensor.attr, 0, 2)
            renamed[f"{name}_scales"] = HFTensor(tensor.attr, 1, 2)
        return renamed

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        if attr in ("w13", "w2"):
            blocks, scales = tensors
            tensors = [dequantize_mxfp4(blocks, scales)]
        return layer.checkpoint_layout(attr, tensors)
