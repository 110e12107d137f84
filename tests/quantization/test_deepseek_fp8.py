"""Block-wise FP8 DeepSeek-V3 checkpoints (DeepSeek-V3's and R1's own format) through the
real loader: a tiny random DeepseekV3 model saved by transformers, every linear weight
DeepSeek quantizes (attention projections, dense and shared MLPs, each routed expert) written
as float8_e4m3fn with a `weight_scale_inv` per 16x16 block, against the same model with the
dequantized weights in float32, run by vjx and by transformers.

The dims are chosen so that blocks straddle what MLA reorders: a head's 20 query columns
(12 without rotary, 8 interleaved rotary ones) cross the 16-row block edges, and
kv_a_proj_with_mqa's 40 rows end in a partial block.
"""

import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from flax import nnx

from tests.helpers.families import VOCAB, float32_model_config
from tests.helpers.model_steps import BLOCK_SIZE, NUM_BLOCKS, prefill, random_blocks
from tests.helpers.tiny_llama import randomize_
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.models.layers.fused_moe import FusedMoE
from vjx.models.layers.linear import Linear
from vjx.models.loader import get_model
from vjx.sharding.mesh import make_mesh
from vjx.sharding.rules import logical_sharding
from vjx.worker.kv_cache_layout import kv_cache_axes, kv_cache_shape

FP8_BLOCK = 16
"""The checkpoint's block edge (`weight_block_size` [16, 16]): several blocks per weight."""
NOT_QUANTIZED = ("embed_tokens", "lm_head", "mlp.gate.weight", "norm")
"""What DeepSeek-V3's checkpoint keeps in bfloat16: embeddings, LM head, router, norms."""
WEIGHT_ONLY_TOL = 1e-4
"""Block FP8 quantizes weights only (vjx's matmul dequantizes them to the activations' dtype;
activations are never quantized), so vjx holds the reference's float32 values exactly and
only summation order differs: relative to the largest logit."""
HF_ATOL = 1e-4
"""Against transformers on the dequantized weights: the family parity test's tolerance."""
ONLINE_REL_TOL = 0.25
"""`quantization="fp8"` at load, against the same weights dequantized (what is left is the
FP8 activations, per token): mean logit error relative to the mean logit size. Measured 0.16,
twice Qwen 3's in tests/quantization/test_fp8.py: three layers, MLA's chained q_a -> q_b
projections and routing decisions that flip with the noise."""
PROMPT_LENS = {"short": 11, "long": 300}


def _hf_config() -> transformers.DeepseekV3Config:
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=12,
        qk_rope_head_dim=8,
        head_dim=8,
        v_head_dim=24,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_interleave=True,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    config.architectures = ["DeepseekV3ForCausalLM"]
    return config


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (float8_e4m3fn values, float32 scales [ceil(out / 16), in / 16],
    the dequantized float32 weight), DeepSeek's layout; a last partial row block is padded."""
    out_features, in_features = weight.shape
    padded_rows = -(-out_features // FP8_BLOCK) * FP8_BLOCK
    padded = torch.zeros(padded_rows, in_features).index_copy_(0, torch.arange(out_features), weight.float())
    blocks = padded.reshape(padded_rows // FP8_BLOCK, FP8_BLOCK, in_features // FP8_BLOCK, FP8_BLOCK)
    scale = blocks.abs().amax((1, 3)).clamp(min=1e-8) / torch.finfo(torch.float8_e4m3fn).max
    full_scale = scale.repeat_interleave(FP8_BLOCK, 0)[:out_features].repeat_interleave(FP8_BLOCK, 1)
    values = (weight.float() / full_scale).to(torch.float8_e4m3fn)
    return values, scale, values.float() * full_scale


def _write_checkpoints(source: pathlib.Path, quantized: pathlib.Path, reference: pathlib.Path) -> set[str]:
    """The checkpoint in `source` block-quantized into `quantized` (config.json with DeepSeek's
    quantization_config) and dequantized into `reference`; returns the quantized weights' names."""
    tensors = safetensors.torch.load_file(source / "model.safetensors")
    fp8_tensors, dequantized = {}, {}
    for name, tensor in tensors.items():
        if tensor.ndim != 2 or any(part in name for part in NOT_QUANTIZED):
            fp8_tensors[name] = dequantized[name] = tensor
            continue
        values, scale, dequantized[name] = _quantize(tensor)
        fp8_tensors[name], fp8_tensors[f"{name}_scale_inv"] = values, scale
    safetensors.torch.save_file(fp8_tensors, quantized / "model.safetensors")
    safetensors.torch.save_file(dequantized, reference / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    (reference / "config.json").write_text(json.dumps(config))
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
    }
    (quantized / "config.json").write_text(json.dumps(config))
    return {name for name in fp8_tensors if name.endswith("_scale_inv")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Directories "quantized" and "reference" (and the names of the quantized weights)."""
    source, quantized, reference = (tmp_path_factory.mktemp(name) for name in ("source", "fp8", "dequantized"))
    torch.manual_seed(0)
    hf_model = transformers.DeepseekV3ForCausalLM(_hf_config()).eval()
    randomize_(hf_model, 0)
    hf_model.save_pretrained(source)
    scale_names = _write_checkpoints(source, quantized, reference)
    shutil.rmtree(source)
    return {"quantized": quantized, "reference": reference, "scale_names": scale_names}


@pytest.fixture(scope="module")
def fp8_model(checkpoints):
    return get_model(float32_model_config(checkpoints["quantized"]), ReferenceBackend())


@pytest.fixture(scope="module")
def reference_model(checkpoints):
    return get_model(float32_model_config(checkpoints["reference"]), ReferenceBackend())


def _caches(model, mesh=None) -> list[jax.Array]:
    """Zeroed latent caches (one per layer, whole on every device of `mesh`)."""
    backend = ReferenceBackend()
    specs = model.get_kv_cache_spec(BLOCK_SIZE, 1, "float32").values()
    return [
        jax.device_put(
            np.zeros(kv_cache_shape(backend, spec, NUM_BLOCKS, num_state_slots=NUM_BLOCKS), np.float32),
            jax.devices()[0] if mesh is None else logical_sharding(mesh, kv_cache_axes(backend, spec)),
        )
        for spec in specs
    ]


def _logits_and_decode(model, token_ids: np.ndarray, seed: int) -> np.ndarray:
    """The prompt's logits and, as a last row, those of one decode step after it (a step of
    fewer (token, expert) pairs than experts reads each pair's expert on its own)."""
    blocks = random_blocks(seed)
    logits, caches = prefill(model, token_ids, 0, blocks, _caches(model))
    decode, _ = prefill(model, token_ids[-1:], len(token_ids), blocks, caches)
    return np.concatenate([logits, decode])


def _token_ids(length: str) -> np.ndarray:
    return np.random.default_rng(PROMPT_LENS[length]).integers(2, VOCAB, PROMPT_LENS[length])


def _hf_logits(directory: pathlib.Path, token_ids: np.ndarray) -> np.ndarray:
    hf_model = transformers.DeepseekV3ForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    hf_model.config._attn_implementation = "eager"
    hf_model.config._experts_implementation = "eager"
    with torch.no_grad():
        return hf_model(torch.as_tensor(token_ids)[None]).logits[0].numpy()


@pytest.mark.parametrize("length", list(PROMPT_LENS))
def test_logits_match_the_dequantized_model(checkpoints, fp8_model, reference_model, length):
    token_ids = _token_ids(length)
    logits = _logits_and_decode(fp8_model, token_ids, seed=PROMPT_LENS[length])
    expected = _logits_and_decode(reference_model, token_ids, seed=PROMPT_LENS[length])
    assert np.abs(expected).max() > 1.0  # not a comparison of near-zero logits
    np.testing.assert_allclose(logits, expected, atol=WEIGHT_ONLY_TOL * np.abs(expected).max(), rtol=0)
    hf_expected = _hf_logits(checkpoints["reference"], token_ids)
    np.testing.assert_allclose(logits[:-1], hf_expected, atol=HF_ATOL, rtol=0)


def _layer(model, index: int):
    return model.model.layers[index]


def test_experts_stay_fp8_with_their_block_scales(checkpoints, fp8_model, reference_model):
    assert len(checkpoints["scale_names"]) == 3 * 8 * 2 + 5 * 3 + 3 + 3 * 2  # experts, attention, MLPs
    E, D, F = 8, 64, 32
    for index in (1, 2):
        experts, reference = _layer(fp8_model, index).mlp.experts, _layer(reference_model, index).mlp.experts
        assert experts.w13[...].dtype == jnp.float8_e4m3fn and experts.w2[...].dtype == jnp.float8_e4m3fn
        assert experts.w13_scale_inv.shape == (E, D // FP8_BLOCK, 2, F)
        assert experts.w2_scale_inv.shape == (E, F // FP8_BLOCK, D)
        for attr in ("w13", "w2"):
            weight = np.asarray(getattr(experts, attr)[...].astype(jnp.float32))
            scale = np.asarray(getattr(experts, f"{attr}_scale_inv")[...])
            dequantized = weight * np.repeat(scale, FP8_BLOCK, axis=1)
            np.testing.assert_array_equal(dequantized, np.asarray(getattr(reference, attr)[...]))


def test_kv_b_proj_is_dequantized_and_rope_rows_keep_their_scales(fp8_model, reference_model):
    attention, reference = _layer(fp8_model, 1).self_attn, _layer(reference_model, 1).self_attn
    kv_b_proj = attention.kv_b_proj
    assert kv_b_proj.kernel[...].dtype == jnp.float32 and kv_b_proj.weight_scale is None
    np.testing.assert_array_equal(np.asarray(kv_b_proj.kernel[...]), np.asarray(reference.kv_b_proj.kernel[...]))
    # The interleaved rotary columns were reordered with their scales: dequantized, the FP8
    # kernels equal the reference's reordered float32 kernels.
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
        layer = getattr(attention, name)
        assert layer.kernel[...].dtype == jnp.float8_e4m3fn, name
        kernel = np.asarray(layer.kernel[...].astype(jnp.float32))
        scale = np.repeat(np.asarray(layer.weight_scale[...]), FP8_BLOCK, axis=0).reshape(kernel.shape)
        np.testing.assert_array_equal(kernel * scale, np.asarray(getattr(reference, name).kernel[...]), err_msg=name)


def _dequantized_copy(directory: pathlib.Path, quantized_model):
    """The float32 model in `directory` with the kernels and experts of `quantized_model`
    (quantized at load, a scale per tensor or channel) dequantized into it."""
    model = get_model(float32_model_config(directory), ReferenceBackend())
    quantized = dict(nnx.iter_graph(quantized_model))
    for path, node in nnx.iter_graph(model):
        source = quantized[path]
        if isinstance(node, FusedMoE):
            node.w13.set_value(source.w13[...].astype(jnp.float32) * source.w13_scale[...][:, None])
            node.w2.set_value(source.w2[...].astype(jnp.float32) * source.w2_scale[...][:, None])
        elif isinstance(node, Linear) and source.kernel[...].dtype == jnp.float8_e4m3fn:
            node.kernel.set_value(source.kernel[...].astype(jnp.float32) * source.weight_scale[...])
    return model


def test_quantizing_at_load_keeps_kv_b_proj_unquantized(checkpoints):
    config = dataclasses.replace(float32_model_config(checkpoints["reference"]), quantization="fp8")
    model = get_model(config, ReferenceBackend())
    attention = _layer(model, 1).self_attn
    assert attention.kv_b_proj.kernel[...].dtype == jnp.float32
    assert attention.q_b_proj.kernel[...].dtype == jnp.float8_e4m3fn
    assert _layer(model, 1).mlp.experts.w13[...].dtype == jnp.float8_e4m3fn
    token_ids = _token_ids("short")
    logits = _logits_and_decode(model, token_ids, seed=0)
    expected = _logits_and_decode(_dequantized_copy(checkpoints["reference"], model), token_ids, seed=0)
    assert np.abs(logits - expected).mean() <= ONLINE_REL_TOL * np.abs(expected).mean()


@pytest.mark.parametrize(
    "quantization_config",
    [
        {"quant_method": "fp8", "activation_scheme": "dynamic"},
        {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
    ],
    ids=["fp8_per_tensor", "awq"],
)
def test_other_quantized_checkpoints_are_refused_by_name(checkpoints, quantization_config):
    hf_config = _hf_config()
    hf_config.quantization_config = quantization_config
    config = dataclasses.replace(float32_model_config(checkpoints["reference"]), hf_config=hf_config)
    with pytest.raises(ValueError, match="block-wise FP8 only"):
        get_model(config, ReferenceBackend())


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp2", "tp2_ep"])
def test_split_over_two_devices_equals_one(checkpoints, fp8_model, expert_parallel):
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=2))
    config = float32_model_config(checkpoints["quantized"])
    sharded = get_model(config, ShardedBackend(ReferenceBackend()), mesh=mesh, enable_expert_parallel=expert_parallel)
    token_ids = _token_ids("long")
    with jax.set_mesh(mesh):
        logits, _ = prefill(sharded, token_ids, 0, random_blocks(0), _caches(sharded, mesh))
    expected, _ = prefill(fp8_model, token_ids, 0, random_blocks(0), _caches(fp8_model))
    np.testing.assert_allclose(logits, expected, atol=WEIGHT_ONLY_TOL * np.abs(expected).max(), rtol=0)
