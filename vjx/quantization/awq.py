"""AWQ checkpoints (`quant_method: "awq"`): 4-bit weights with a zero point and a scale per
group of input rows (int4.py holds the method).

AutoAWQ's GEMM layout: `qweight` [in, out / 8] int32 and `qzeros` [groups, out / 8] int32 pack
eight output columns per word in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds column
`AWQ_ORDER[i]`); `scales` [groups, out] float16.
"""

import dataclasses

import numpy as np
from flax import nnx

from vjx.quantization.base import LinearMethod, QuantizationConfig
from vjx.quantization.int4 import Int4LinearMethod, unpack_int32

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class AWQConfig(QuantizationConfig):
    def __init__(self, group_size: int, modules_to_not_convert: tuple[str, ...] = ()):
        self.group_size = group_size
        self.modules_to_not_convert = modules_to_not_convert

    @classmethod
    def get_name(cls) -> str:
        return "awq"

    @classmethod
    def from_config(cls, config: dict) -> "AWQConfig":
        bits = config.get("bits", config.get("w_bit"))
        zero_point = config.get("zero_point", True)
        version = str(config.get("version", "gemm")).lower()
        if bits != 4 or not zero_point or version != "gemm":
            raise ValueError(
                f"vjx loads AWQ checkpoints with 4 bits, zero points and the GEMM layout, got bits={bits}, "
                f"zero_point={zero_point}, version={version!r}."
            )
        group_size = config.get("group_size", config.get("q_group_size", 128))
        return cls(group_size, tuple(config.get("modules_to_not_convert") or ()))

    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        if prefix == "lm_head" or any(module in prefix for module in self.modules_to_not_convert):
            return None
        return AWQLinearMethod(self.group_size)


@dataclasses.dataclass(frozen=True)
class AWQLinearMethod(Int4LinearMethod):
    HF_NAMES = {"qweight": "kernel", "scales": "weight_scale", "qzeros": "weight_zero_point"}

    def unpack_weight(self, tensor: np.ndarray) -> np.ndarray:
        return unpack_int32(tensor, AWQ_ORDER)

    def unpack_zeros(self, tensor: np.ndarray) -> np.ndarray:
        return unpack_int32(tensor, AWQ_ORDER)
