"""Which quantization config a checkpoint and `quantization=` give, and the refusals."""

import types

import pytest

from vjx.quantization import get_quantization_config
from vjx.quantization.awq import AWQConfig
from vjx.quantization.compressed_tensors import CompressedTensorsConfig
from vjx.quantization.fp8 import Fp8Config, PtpcFp8Config
from vjx.quantization.gptq import GPTQConfig

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
INT8 = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "strategy": "token",
                "symmetric": True,
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head"],
}
# llm-compressor's fp8 KV cache scheme: per-tensor k_scale / v_scale in each attention layer.
FP8_KV_CACHE = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def _hf_config(quantization_config=None):
    return types.SimpleNamespace(quantization_config=quantization_config)


@pytest.mark.parametrize(
    "quantization, checkpoint, config_type",
    [
        (None, None, type(None)),
        ("fp8", None, Fp8Config),
        ("ptpc_fp8", None, PtpcFp8Config),
        (None, AWQ, AWQConfig),
        ("awq", AWQ, AWQConfig),
        (None, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}, GPTQConfig),
        (None, {"quant_method": "fp8", "activation_scheme": "static"}, Fp8Config),
        (None, INT8, CompressedTensorsConfig),
        (None, {**INT8, "kv_cache_scheme": FP8_KV_CACHE}, CompressedTensorsConfig),
    ],
)
def test_the_config_comes_from_the_checkpoint_or_the_argument(quantization, checkpoint, config_type):
    assert type(get_quantization_config(quantization, _hf_config(checkpoint))) is config_type


@pytest.mark.parametrize(
    "quantization, checkpoint, message",
    [
        ("awq", None, r"quantization='awq' is not supported by vjx on an unquantized checkpoint"),
        ("fp8", AWQ, r"quantization='fp8' does not match the checkpoint's quant_method 'awq'"),
        (None, {"quant_method": "bitsandbytes"}, r"quant_method 'bitsandbytes'; vjx loads"),
        (None, {**AWQ, "bits": 3}, r"4 bits, zero points and the GEMM layout, got bits=3"),
        (None, {"quant_method": "gptq", "bits": 8}, r"GPTQ checkpoints with 4 bits"),
        (None, {"quant_method": "fp8", "activation_scheme": "later"}, r"activation_scheme must be one of"),
        (
            None,
            {**INT8, "kv_cache_scheme": {"num_bits": 8}},
            r"kv_cache_scheme must be static per-tensor symmetric fp8",
        ),
        (
            None,
            {**INT8, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head"}},
            r"kv_cache_scheme must be static per-tensor symmetric fp8",
        ),
        (
            None,
            {
                **INT8,
                "config_groups": {"g": {**INT8["config_groups"]["group_0"], "output_activations": {"num_bits": 8}}},
            },
            r"without output quantization",
        ),
    ],
)
def test_what_vjx_does_not_load_is_refused_by_name(quantization, checkpoint, message):
    with pytest.raises(ValueError, match=message):
        get_quantization_config(quantization, _hf_config(checkpoint))
