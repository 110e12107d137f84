"""Quantized MoE experts: `quantization="fp8"` / `"ptpc_fp8"` on a tiny random Qwen3-MoE
checkpoint (FP8 experts beside FP8 linear layers), a tiny gpt-oss checkpoint with MXFP4
experts against transformers running the same weights dequantized, and the refusals."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from flax import nnx
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from tests.helpers.families import VOCAB, Family
from tests.helpers.model_steps import prefill, random_blocks
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.models.layers.fused_moe import FusedMoE
from vjx.models.layers.linear import Linear
from vjx.models.loader import get_model
from vjx.quantization.fp8 import Fp8OnlineMoEMethod
from vjx.quantization.mxfp4 import dequantize_mxfp4
from vjx.sharding.mesh import make_mesh

PROMPT_LEN = 64
REL_TOL = 0.1
"""Mean logit error of the FP8 model relative to the mean logit of the same model with its
weights dequantized (the activations of the linear layers are quantized per token)."""
EP_REL_TOL = 0.01


def _token_ids() -> np.ndarray:
    return np.random.default_rng(0).integers(2, VOCAB, PROMPT_LEN)


def _layers(model, kind) -> dict:
    return {".".join(map(str, path)): node for path, node in nnx.iter_graph(model) if isinstance(node, kind)}


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory) -> Family:
    return Family("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


@pytest.mark.parametrize("method", ["fp8", "ptpc_fp8"])
def test_fp8_experts_take_one_byte_and_match_their_dequantized_model(qwen3_moe, method):
    config = dataclasses.replace(qwen3_moe.model_config, quantization=method)
    fp8_model = get_model(config, ReferenceBackend())
    experts = _layers(fp8_model, FusedMoE)
    assert experts
    for layer in experts.values():
        assert layer.quant_method == Fp8OnlineMoEMethod(per_channel=method == "ptpc_fp8")
        E, D, _, F = layer.w13.shape
        assert layer.w13.dtype == layer.w2.dtype == jnp.float8_e4m3fn
        assert layer.w13_scale.shape == (E, 2, F) and layer.w2_scale.shape == (E, D)
        per_projection = np.ptp(np.asarray(layer.w13_scale[...]), axis=-1).max() == 0
        assert per_projection == (method == "fp8")

    model = get_model(qwen3_moe.model_config, ReferenceBackend())
    for prefix, layer in _layers(model, FusedMoE).items():
        fp8 = experts[prefix]
        layer.w13.set_value(fp8.w13[...].astype(jnp.float32) * fp8.w13_scale[...][:, None])
        layer.w2.set_value(fp8.w2[...].astype(jnp.float32) * fp8.w2_scale[...][:, None])
    fp8_linears = _layers(fp8_model, Linear)
    for prefix, layer in _layers(model, Linear).items():
        if prefix != "lm_head":
            layer.kernel.set_value(
                fp8_linears[prefix].kernel[...].astype(jnp.float32) * fp8_linears[prefix].weight_scale[...]
            )
    expected, _ = prefill(model, _token_ids(), 0, random_blocks(0), qwen3_moe.caches())
    logits, _ = prefill(fp8_model, _token_ids(), 0, random_blocks(0), qwen3_moe.caches())
    assert np.abs(logits - expected).mean() <= REL_TOL * np.abs(expected).mean()

    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    sharded = get_model(config, ShardedBackend(ReferenceBackend()), mesh=mesh, enable_expert_parallel=True)
    for layer in _layers(sharded, FusedMoE).values():
        assert tuple(layer.w13_scale[...].sharding.spec)[0] == "model"
    with jax.set_mesh(mesh):
        ep_logits, _ = prefill(sharded, _token_ids(), 0, random_blocks(0), qwen3_moe.caches(4, mesh))
    np.testing.assert_allclose(ep_logits, logits, atol=EP_REL_TOL * np.abs(logits).max(), rtol=0)


def test_mxfp4_dequantization_equals_transformers():
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 8, 2, 16), dtype=np.uint8)
    scales = rng.integers(110, 140, (3, 8, 2), dtype=np.uint8)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(dequantize_mxfp4(blocks, scales), theirs.numpy())


def _write_mxfp4_checkpoint(family: Family, directory) -> None:
    """The family's gpt-oss checkpoint with MXFP4 experts: random codes and scales, which the
    HF model (kept for the reference logits) gets dequantized by transformers' own code."""
    rng = np.random.default_rng(1)
    tensors = {}
    for name, param in family.hf_model.named_parameters():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = param.detach().clone()
            continue
        E, d_in, d_out = param.shape
        blocks = torch.from_numpy(rng.integers(0, 256, (E, d_out, d_in // 32, 16), dtype=np.uint8))
        scales = torch.from_numpy(rng.integers(122, 125, (E, d_out, d_in // 32), dtype=np.uint8))
        with torch.no_grad():
            param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
    safetensors.torch.save_file(tensors, directory / "model.safetensors")
    config = family.hf_config.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (directory / "config.json").write_text(json.dumps(config))


def test_gpt_oss_with_mxfp4_experts_matches_transformers(tmp_path_factory):
    family = Family("gpt_oss", tmp_path_factory.mktemp("gpt_oss"))
    directory = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    _write_mxfp4_checkpoint(family, directory)
    hf_config = transformers.AutoConfig.from_pretrained(directory)
    config = dataclasses.replace(family.model_config, model=str(directory), hf_config=hf_config)
    model = get_model(config, ReferenceBackend())
    token_ids = _token_ids()
    logits, _ = prefill(model, token_ids, 0, random_blocks(0), family.caches())
    np.testing.assert_allclose(logits, family.hf_logits(token_ids), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    ("quantization_config", "error"),
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "FP8 checkpoints of MoE models are not loaded"),
        (
            {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
            "quantization 'awq' has no method for MoE experts",
        ),
        ({"quant_method": "mxfp4"}, "MXFP4 experts are read from fused expert tensors"),
    ],
)
def test_moe_checkpoints_of_unbuilt_schemes_are_refused(qwen3_moe, quantization_config, error):
    hf_config = qwen3_moe.model_config.hf_config
    quantized = transformers.Qwen3MoeConfig(**{**hf_config.to_dict(), "quantization_config": quantization_config})
    config = dataclasses.replace(qwen3_moe.model_config, hf_config=quantized)
    with pytest.raises(ValueError, match=error):
        get_model(config, ReferenceBackend())
