"""`compressed-tensors` checkpoints (`quant_method: "compressed-tensors"`, as llm-compressor
writes them): the scheme of each linear layer comes from the config's `config_groups`.

Schemes vjx loads:
- FP8 W8A8 ("float-quantized"): weights per tensor or per channel, activations dynamic per
  token or static per tensor (`input_scale`); block-wise FP8 weights (`block_structure`);
- INT8 W8A8 ("int-quantized"): the same with int8 values, symmetric activations;
- INT4 weight-only ("pack-quantized", symmetric): `weight_packed` [out, in / 8] int32, eight
  consecutive input columns per word, each stored as its value + 8; `weight_scale`
  [out, groups].

A `kv_cache_scheme` must be vLLM's fp8 one (8-bit float, static, per tensor, symmetric): its
`self_attn.k_scale` / `v_scale` load into the attention layers and apply when the engine runs
with `kv_cache_dtype="fp8"`, as in vLLM.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from flax import nnx

from vjx.quantization.base import LinearMethod, QuantizationConfig, abstract_param, is_layer_skipped
from vjx.quantization.fp8 import BlockFp8LinearMethod
from vjx.quantization.int4 import Int4LinearMethod, unpack_int32
from vjx.quantization.w8a8 import W8A8LinearMethod

W8A8_DTYPES = {"float": "float8_e4m3fn", "int": "int8"}


class CompressedTensorsConfig(QuantizationConfig):
    def __init__(self, scheme: dict, ignore: Sequence[str]):
        self.method = _method_of(scheme)
        self.ignore = tuple(ignore)

    @classmethod
    def get_name(cls) -> str:
        return "compressed-tensors"

    @classmethod
    def from_config(cls, config: dict) -> "CompressedTensorsConfig":
        groups = list((config.get("config_groups") or {}).values())
        if len(groups) != 1 or groups[0].get("targets") != ["Linear"]:
            raise ValueError(
                "vjx loads compressed-tensors checkpoints with one config group targeting 'Linear', "
                f"got {config.get('config_groups')}."
            )
        if config.get("sparsity_config") or config.get("transform_config"):
            raise ValueError("vjx loads no compressed-tensors sparsity or transform yet.")
        _check_kv_cache_scheme(config.get("kv_cache_scheme"))
        return cls(groups[0], config.get("ignore") or ())

    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        return None if is_layer_skipped(layer, prefix, self.ignore) else self.method


def _check_kv_cache_scheme(scheme: dict | None) -> None:
    """Refuses a KV cache scheme other than fp8 per tensor (keys left out take compressed-tensors'
    QuantizationArgs defaults)."""
    fp8_per_tensor = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    defaults = {"num_bits": 8, "type": "int", "strategy": None, "dynamic": False, "symmetric": True}
    if scheme and any({**defaults, **scheme}[key] != value for key, value in fp8_per_tensor.items()):
        raise ValueError(f"kv_cache_scheme must be static per-tensor symmetric fp8 {fp8_per_tensor}, got {scheme}.")


def _method_of(scheme: dict) -> LinearMethod:
    weights, inputs = scheme.get("weights") or {}, scheme.get("input_activations")
    if scheme.get("output_activations") or not weights or weights.get("dynamic") or not weights.get("symmetric"):
        raise ValueError(f"vjx loads symmetric static weight schemes without output quantization, got {scheme}.")
    kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
    if bits == 8 and kind == "float" and strategy == "block" and _dynamic_per_group(inputs):
        return BlockFp8LinearMethod(tuple(weights["block_structure"]), "weight_scale")
    if bits == 8 and kind in W8A8_DTYPES and strategy in ("tensor", "channel") and inputs is not None:
        static = _static_input(inputs, kind)
        return W8A8LinearMethod(W8A8_DTYPES[kind], static_input_scale=static)
    if bits == 4 and kind == "int" and strategy in ("group", "channel") and inputs is None:
        group_size = weights.get("group_size") if strategy == "group" else -1
        if weights.get("actorder"):
            raise ValueError("vjx loads compressed-tensors INT4 checkpoints without act-order.")
        return PackedInt4LinearMethod(group_size)
    raise ValueError(f"vjx does not load the compressed-tensors scheme {scheme}.")


def _static_input(inputs: dict, kind: str) -> bool:
    """Whether activations use the checkpoint's `input_scale` (else: per token as they come)."""
    if inputs.get("type") != kind or inputs.get("num_bits") != 8 or not inputs.get("symmetric"):
        raise ValueError(f"activations must be symmetric 8-bit {kind} like the weights, got {inputs}.")
    if inputs.get("dynamic") and inputs.get("strategy") == "token":
        return False
    if not inputs.get("dynamic") and inputs.get("strategy") == "tensor":
        return True
    raise ValueError(f"activations must be dynamic per token or static per tensor, got {inputs}.")


def _dynamic_per_group(inputs: dict | None) -> bool:
    if inputs is None or not (inputs.get("dynamic") and inputs.get("strategy") == "group"):
        raise ValueError(f"block-wise FP8 takes dynamic per-group activations, got {inputs}.")
    return True


@dataclasses.dataclass(frozen=True)
class PackedInt4LinearMethod(Int4LinearMethod):
    """compressed-tensors' pack-quantized INT4 (symmetric: no zero points). Its
    `weight_shape` tensor (the unpacked shape) is checked against the layer's."""

    HF_NAMES = {"weight_packed": "kernel", "weight_scale": "weight_scale", "weight_shape": "weight_shape"}

    def create_weights(self, layer: nnx.Module) -> None:
        super().create_weights(layer)
        layer.weight_shape = abstract_param((2,), np.int32, (None,))

    def unpack_weight(self, tensor: np.ndarray) -> np.ndarray:
        return unpack_int32(tensor).T

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        if attr == "weight_scale":
            return super().to_param_layout(layer, attr, [np.asarray(tensor).T for tensor in tensors])
        if attr == "weight_shape":
            widths, shapes = layer.part_widths(), [tuple(np.asarray(tensor).tolist()) for tensor in tensors]
            num_in = int(np.prod(layer.in_shape))
            if shapes != [(width, num_in) for width in widths]:
                raise ValueError(f"packed weights of shapes {shapes} do not fit a layer of {num_in} inputs.")
            return np.asarray(shapes[0], np.int32)
        return super().to_param_layout(layer, attr, tensors)

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        del layer.weight_shape
        super().process_weights_after_loading(layer, sharding_of)
