"""Pre-quantized checkpoints through the real loader: each format (written by
benchmarks/quantized_checkpoints.py) of a tiny random Llama, Qwen 3 or Phi-3 (whose checkpoint
fuses qkv and gate_up), against the same model dequantized in float32; a few also split over 4
(fake CPU) devices."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from benchmarks.quantized_checkpoints import FORMATS, WEIGHT_ONLY, write_checkpoint
from tests.helpers.families import family_config
from tests.helpers.model_steps import BLOCK_SIZE, NUM_BLOCKS, prefill, random_blocks
from tests.helpers.tiny_llama import VOCAB, randomize_, tiny_config
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ModelConfig, ParallelConfig
from vjx.models.layers.linear import Linear
from vjx.models.loader import get_model
from vjx.sharding.mesh import make_mesh
from vjx.sharding.placement import num_cache_kv_heads
from vjx.sharding.rules import logical_sharding

PROMPT_LEN = 64
GROUP = 16
"""INT4 group size and FP8 block edge: several groups in the tiny models (hidden 64)."""
MODELS = {
    "llama": lambda: tiny_config(2),
    "qwen3": lambda: family_config("qwen3"),
    "phi3": lambda: family_config("phi3"),
}
MODEL_OF = dict(zip(FORMATS, itertools.cycle(MODELS), strict=False))
"""Each format on one of the models, in turn."""
WEIGHT_ONLY_TOL = 1e-4
"""Weight-only formats: vjx dequantizes to the same float32 values the reference holds, so
only summation order differs (relative to the largest logit)."""
REL_TOL = 0.1
"""8-bit activations: mean logit error relative to the reference's mean logit size (as for
quantization='fp8', tests/quantization/test_fp8.py)."""
TOP_2_RATE = 0.95
TP_FORMATS = ("ct_int8", "gptq_act_order", "fp8_block")
"""One format of each storage (8-bit per channel, INT4 with act-order, FP8 blocks)."""
TP_REL_TOL = 0.01
"""Split over 4 devices vs one: 8-bit activations may round a few values differently."""
WEIGHT_BYTES = {"float8_e4m3fn": 1.0, "int8": 1.0, "uint8": 0.5}
"""Device bytes per weight of each kernel dtype (uint8: two 4-bit values a byte)."""


@pytest.fixture(scope="module", params=FORMATS)
def checkpoint(request, tmp_path_factory):
    """(format, the quantized model's config, the dequantized reference's)."""
    name = request.param
    hf_config = MODELS[MODEL_OF[name]]()
    hf_config.architectures = hf_config.architectures or ["LlamaForCausalLM"]
    torch.manual_seed(0)
    hf_model = getattr(transformers, hf_config.architectures[0])(hf_config).eval()
    randomize_(hf_model, 0)
    quantized_dir, reference_dir = tmp_path_factory.mktemp(name), tmp_path_factory.mktemp(f"{name}_reference")
    write_checkpoint(name, hf_model, quantized_dir, reference_dir, GROUP)
    return name, _model_config(quantized_dir), _model_config(reference_dir)


def _model_config(directory) -> ModelConfig:
    return ModelConfig(
        model=str(directory),
        tokenizer=str(directory),
        hf_config=transformers.AutoConfig.from_pretrained(directory),
        dtype="float32",
        max_model_len=512,
        seed=0,
        load_format="auto",
    )


def _caches(model_config: ModelConfig, tensor_parallel_size: int = 1, mesh=None) -> list[jax.Array]:
    text = model_config.hf_text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    num_kv_heads = num_cache_kv_heads(text.num_key_value_heads, tensor_parallel_size)
    shape = ReferenceBackend().kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim)
    device = jax.devices()[0] if mesh is None else logical_sharding(mesh, ReferenceBackend().kv_cache_axes)
    zeros = jax.device_put(np.zeros(shape, np.float32), device)
    return [zeros.copy() for _ in range(text.num_hidden_layers)]


def _logits(model, model_config, tensor_parallel_size: int = 1, mesh=None) -> np.ndarray:
    token_ids = np.random.default_rng(0).integers(2, VOCAB, PROMPT_LEN)
    caches = _caches(model_config, tensor_parallel_size, mesh)
    logits, _ = prefill(model, token_ids, 0, random_blocks(0), caches)
    return logits


def _linears(model) -> dict[str, Linear]:
    return {".".join(map(str, path)): node for path, node in nnx.iter_graph(model) if isinstance(node, Linear)}


@pytest.fixture(scope="module")
def quantized_model(checkpoint):
    return get_model(checkpoint[1], ReferenceBackend())


def test_logits_near_the_dequantized_model(checkpoint, quantized_model):
    name, quantized_config, reference_config = checkpoint
    expected = _logits(get_model(reference_config, ReferenceBackend()), reference_config)
    logits = _logits(quantized_model, quantized_config)
    if name in WEIGHT_ONLY:
        np.testing.assert_allclose(logits, expected, atol=WEIGHT_ONLY_TOL * np.abs(expected).max(), rtol=0)
        return
    assert np.abs(logits - expected).mean() <= REL_TOL * np.abs(expected).mean()
    top_2 = np.argsort(expected, axis=-1)[:, -2:]
    assert (top_2 == logits.argmax(-1)[:, None]).any(-1).mean() >= TOP_2_RATE


def test_weights_take_the_bytes_of_their_format(checkpoint, quantized_model):
    linears = _linears(quantized_model)
    for prefix, layer in linears.items():
        kernel = layer.kernel[...]
        if prefix == "lm_head":
            assert kernel.dtype == jnp.float32
            continue
        num_weights = int(np.prod(layer.in_shape)) * int(np.prod(layer.out_shape))
        assert kernel.nbytes == num_weights * WEIGHT_BYTES[kernel.dtype.name], prefix
        scale = layer.weight_scale[...]
        groups = int(np.prod(layer.in_shape)) // GROUP if scale.ndim > len(layer.out_shape) else 1
        assert scale.shape[-len(layer.out_shape) :] == layer.out_shape
        assert scale.size == groups * int(np.prod(layer.out_shape)), prefix


@pytest.mark.parametrize("checkpoint", TP_FORMATS, indirect=True)
def test_tensor_parallel_equals_one_device(checkpoint, quantized_model):
    _, quantized_config, _ = checkpoint
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    sharded = get_model(quantized_config, ShardedBackend(ReferenceBackend()), mesh=mesh)
    with jax.set_mesh(mesh):
        logits = _logits(sharded, quantized_config, 4, mesh)
    expected = _logits(quantized_model, quantized_config)
    np.testing.assert_allclose(logits, expected, atol=TP_REL_TOL * np.abs(expected).max(), rtol=0)
