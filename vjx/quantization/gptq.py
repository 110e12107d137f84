"""GPTQ checkpoints (`quant_method: "gptq"`): 4-bit weights with a zero point and a scale per
group of input rows, optionally in act-order (`desc_act`; int4.py holds the method).

AutoGPTQ's layout: `qweight` [in / 8, out] int32 packs eight consecutive input rows per word
(nibble i holds row 8r + i); `qzeros` [groups, out / 8] int32 packs eight consecutive output
columns, each stored as its zero point minus one (the "v1" format; "gptq_v2" stores it as is);
`scales` [groups, out] float16; `g_idx` [in] int32 is each input row's group.
"""

import dataclasses

import numpy as np
from flax import nnx

from vjx.quantization.base import LinearMethod, QuantizationConfig
from vjx.quantization.int4 import Int4LinearMethod, unpack_int32

CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


class GPTQConfig(QuantizationConfig):
    def __init__(self, group_size: int, desc_act: bool, zero_offset: int):
        self.group_size = group_size
        self.desc_act = desc_act
        self.zero_offset = zero_offset

    @classmethod
    def get_name(cls) -> str:
        return "gptq"

    @classmethod
    def from_config(cls, config: dict) -> "GPTQConfig":
        bits = config.get("bits")
        checkpoint_format = config.get("checkpoint_format", "gptq")
        if bits != 4 or checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(
                f"vjx loads GPTQ checkpoints with 4 bits in the formats {CHECKPOINT_FORMATS}, got bits={bits}, "
                f"checkpoint_format={checkpoint_format!r}."
            )
        zero_offset = 1 if checkpoint_format == "gptq" else 0
        return cls(config.get("group_size", 128), bool(config.get("desc_act", False)), zero_offset)

    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        if prefix == "lm_head":
            return None
        return GPTQLinearMethod(self.group_size, self.desc_act, self.zero_offset)


@dataclasses.dataclass(frozen=True)
class GPTQLinearMethod(Int4LinearMethod):
    zero_offset: int = 1

    HF_NAMES = {"qweight": "kernel", "scales": "weight_scale", "qzeros": "weight_zero_point", "g_idx": "g_idx"}

    def unpack_weight(self, tensor: np.ndarray) -> np.ndarray:
        words = np.asarray(tensor).T
        return unpack_int32(words).T

    def unpack_zeros(self, tensor: np.ndarray) -> np.ndarray:
        return unpack_int32(tensor) + np.uint8(self.zero_offset)
