"""`quantization="fp8"` and `"ptpc_fp8"`: tiny random Qwen 3 and Phi-3 checkpoints (Phi-3's
fused qkv and gate_up tensors included) loaded through the real loader and quantized at load,
against the same checkpoint in float32, on one device and split over 4 (fake CPU) devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.families import VOCAB, Family
from tests.helpers.model_steps import prefill, random_blocks
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.models.layers.linear import Linear
from vjx.models.loader import get_model
from vjx.quantization.fp8 import Fp8OnlineLinearMethod
from vjx.sharding.mesh import make_mesh

PROMPT_LEN = 64
REL_TOL = 0.1
"""Mean logit error of the FP8 model, relative to the dequantized model's mean logit size.
(Measured: 0.08 and 0.07; FP8 activations round each element by up to 6%, and a random
model's layers carry that noise to the logits undamped.)"""
TOP_2_RATE = 0.95
"""Share of positions whose FP8 argmax is one of the dequantized model's top 2 (measured:
0.98 and 0.97 of 64)."""
TP_REL_TOL = 0.01
"""The same, split over 4 devices vs one: sums that round differently move a few activations
to the next FP8 value."""


@pytest.fixture(scope="module", params=[("qwen3", "fp8"), ("phi3", "ptpc_fp8")], ids=lambda param: param[1])
def family_and_method(request, tmp_path_factory) -> tuple[Family, str]:
    name, method = request.param
    return Family(name, tmp_path_factory.mktemp(name)), method


@pytest.fixture(scope="module")
def family(family_and_method) -> Family:
    return family_and_method[0]


@pytest.fixture(scope="module")
def fp8_config(family_and_method):
    family, method = family_and_method
    return dataclasses.replace(family.model_config, quantization=method)


@pytest.fixture(scope="module")
def fp8_model(fp8_config):
    return get_model(fp8_config, ReferenceBackend())


def _token_ids() -> np.ndarray:
    return np.random.default_rng(0).integers(2, VOCAB, PROMPT_LEN)


def _linears(model) -> dict[str, Linear]:
    return {".".join(map(str, path)): node for path, node in nnx.iter_graph(model) if isinstance(node, Linear)}


@pytest.fixture(scope="module")
def dequantized_model(family, fp8_model):
    """The float32 model whose kernels are the FP8 model's, dequantized (the error left is the
    activations' quantization)."""
    model = get_model(family.model_config, ReferenceBackend())
    fp8_linears = _linears(fp8_model)
    for prefix, layer in _linears(model).items():
        fp8 = fp8_linears[prefix]
        if prefix != "lm_head":
            layer.kernel.set_value(fp8.kernel[...].astype(jnp.float32) * fp8.weight_scale[...])
    return model


def test_logits_near_the_dequantized_model_and_greedy_tokens_in_its_top_2(family, fp8_model, dequantized_model):
    token_ids = _token_ids()
    expected, _ = prefill(dequantized_model, token_ids, 0, random_blocks(0), family.caches())
    logits, _ = prefill(fp8_model, token_ids, 0, random_blocks(0), family.caches())
    assert np.abs(logits - expected).mean() <= REL_TOL * np.abs(expected).mean()
    top_2 = np.argsort(expected, axis=-1)[:, -2:]
    assert (top_2 == logits.argmax(-1)[:, None]).any(-1).mean() >= TOP_2_RATE


def test_weights_take_one_byte_each_and_a_scale_per_output_channel(fp8_model, fp8_config):
    linears = _linears(fp8_model)
    assert linears
    for prefix, layer in linears.items():
        if prefix == "lm_head":
            assert layer.kernel.dtype == jnp.float32
            continue
        assert isinstance(layer.quant_method, Fp8OnlineLinearMethod), prefix
        kernel, scale = layer.kernel[...], layer.weight_scale[...]
        assert kernel.dtype == jnp.float8_e4m3fn and kernel.nbytes == kernel.size
        assert scale.dtype == jnp.float32 and scale.shape == kernel.shape[layer.num_in_dims :]
        assert (np.unique(np.asarray(scale)).size == 1) == (fp8_config.quantization == "fp8"), prefix


def test_tensor_parallel_equals_one_device(family, fp8_config, fp8_model):
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    sharded = get_model(fp8_config, ShardedBackend(ReferenceBackend()), mesh=mesh)
    for prefix, layer in _linears(sharded).items():
        if prefix != "lm_head":
            assert (
                tuple(layer.weight_scale[...].sharding.spec)
                == tuple(layer.kernel[...].sharding.spec)[layer.num_in_dims :]
            )
    token_ids = _token_ids()
    with jax.set_mesh(mesh):
        logits, _ = prefill(sharded, token_ids, 0, random_blocks(0), family.caches(4, mesh))
    expected, _ = prefill(fp8_model, token_ids, 0, random_blocks(0), family.caches())
    np.testing.assert_allclose(logits, expected, atol=TP_REL_TOL * np.abs(expected).max(), rtol=0)
