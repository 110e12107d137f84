"""FP8 linear layers on the GPU (run with `pytest -m gpu` on the device): the W8A8 matmul
must compile to cuBLASLt's FP8 GEMM, not to a dequantize-then-bf16 dot, at Llama-3.1-8B's
down_proj shape with random weights, and give the dequantized product's values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import SingleDeviceSharding

from vjx.models.layers.linear import Linear
from vjx.quantization.fp8 import Fp8OnlineLinearMethod

pytestmark = pytest.mark.gpu

HIDDEN, MLP, TOKENS = 4096, 14336, 64
FP8_GEMM = "__cublas$lt$matmul$f8"
"""XLA's custom call for an FP8 GEMM on Hopper."""
REL_TOL = 0.05
"""Mean error relative to the float32 product of the same FP8 weights: the activations'
per-token FP8 rounding (up to 6% an element) averages out over 14336 products."""


@pytest.fixture(scope="module", params=[False, True], ids=["per_tensor", "per_channel"])
def layer(request) -> Linear:
    down_proj = Linear(
        "TF,FD->TD", (MLP, HIDDEN), ("mlp", "embed"), use_bias=False, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
    )
    down_proj.kernel.set_value(down_proj.kernel[...] * 5)
    method = Fp8OnlineLinearMethod(per_channel=request.param)
    method.process_weights_after_loading(down_proj, lambda axes: SingleDeviceSharding(jax.devices()[0]))
    down_proj.quant_method = method
    return down_proj


def _apply(graphdef, state, x):
    return nnx.merge(graphdef, state)(x)


def test_the_matmul_compiles_to_an_fp8_gemm(layer):
    graphdef, state = nnx.split(layer)
    x = jax.random.normal(jax.random.key(1), (TOKENS, MLP), jnp.bfloat16)
    hlo = jax.jit(_apply, static_argnums=0).lower(graphdef, state, x).compile().as_text()
    assert FP8_GEMM in hlo


def test_the_fp8_gemm_gives_the_dequantized_product(layer):
    graphdef, state = nnx.split(layer)
    x = jax.random.normal(jax.random.key(1), (TOKENS, MLP), jnp.bfloat16)
    y = np.asarray(jax.jit(_apply, static_argnums=0)(graphdef, state, x), np.float32)
    w = np.asarray(layer.kernel[...], np.float32) * np.asarray(layer.weight_scale[...])
    expected = np.asarray(x, np.float32) @ w
    assert np.abs(y - expected).mean() <= REL_TOL * np.abs(expected).mean()
