"""The Pallas W4A16 kernel (interpret mode on CPU) against the jnp product it replaces, alone and
per device under tensor parallelism; its shape rules; on GPU, the compiled kernel at Llama-8B
shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from tests.helpers.quick_compile import quick_jit
from vjx.kernels.int4_matmul import int4_matmul, kernel_fits
from vjx.models.layers.param import logical_param
from vjx.quantization.int4 import dequantized_matmul, int4_linear


def _weights(num_in: int, num_out: int, group_size: int, zeros: bool, seed: int = 0):
    """Random packed nibbles [K / 2, N], scales [G, N] near a model's (~0.01) and zero points."""
    rng = np.random.default_rng(seed)
    groups = num_in // group_size
    packed = rng.integers(0, 256, (num_in // 2, num_out), dtype=np.uint8)
    scale = rng.uniform(0.005, 0.02, (groups, num_out)).astype(np.float32)
    zero = rng.integers(0, 16, (groups, num_out), dtype=np.uint8) if zeros else None
    return jnp.asarray(packed), jnp.asarray(scale), None if zero is None else jnp.asarray(zero)


@pytest.mark.parametrize(
    "num_rows, num_in, num_out, group_size, zeros, dtype",
    [
        (1, 256, 128, 128, True, jnp.float32),  # decode row, AWQ/GPTQ groups of 128
        (37, 576, 192, 64, False, jnp.float32),  # rows padded to 64, symmetric, BN 64
        (20, 576, 64, 576, True, jnp.float32),  # one group (per channel), BK 64
        (5, 512, 256, 128, True, jnp.bfloat16),
    ],
)
def test_kernel_equals_the_dequantized_product(num_rows, num_in, num_out, group_size, zeros, dtype):
    packed, scale, zero = _weights(num_in, num_out, group_size, zeros)
    x = jax.random.normal(jax.random.key(1), (num_rows, num_in), dtype)
    got = int4_matmul(x, packed, scale.astype(dtype), zero, group_size=group_size, interpret=True)
    want = dequantized_matmul(x.astype(jnp.float32), packed, scale, zero)
    assert got.shape == (num_rows, num_out) and got.dtype == dtype
    # float32: summation order only; bfloat16: the dequantized weights and output rounded.
    atol = 1e-5 if dtype == jnp.float32 else 2e-2 * float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=1e-4, atol=atol)


@pytest.mark.parametrize(
    "num_in, num_out, group_size, fits",
    [(4096, 14336, 128, True), (576, 24, 64, False), (576, 64, 576, True), (96, 64, 32, True), (96, 64, 48, False)],
)
def test_kernel_fits_where_its_tiles_divide(num_in, num_out, group_size, fits):
    """BN (a power of two <= 128 dividing N) and BK / 2 (BK: a power of two <= 128 dividing the
    group size) must reach Triton's smallest dot, 16."""
    assert kernel_fits(num_in, num_out, group_size) is fits


def test_kernel_refuses_shapes_it_does_not_fit():
    packed, scale, zero = _weights(576, 24, 64, True)
    with pytest.raises(ValueError, match=r"tiles do not divide K=576, N=24, group size 64"):
        int4_matmul(jnp.ones((1, 576)), packed, scale, zero, group_size=64, interpret=True)


@pytest.mark.parametrize(
    "axes",
    [("embed", "mlp"), ("mlp", "embed")],
    ids=["column-parallel", "row-parallel"],
)
def test_kernel_per_device_under_tensor_parallelism_equals_one_device(axes):
    """On a 2-device `model` axis each device multiplies its shard (row-parallel: its inputs,
    then a psum); the result is the unsharded jnp product."""
    num_in, num_out, group_size = 512, 256, 128
    packed, scale, zero = _weights(num_in, num_out, group_size, zeros=True, seed=2)
    params = [logical_param(value, axes) for value in (packed, scale, zero)]
    x = jax.random.normal(jax.random.key(3), (9, num_in), jnp.float32)
    want = dequantized_matmul(x, packed, scale, zero)
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("model",))
    with jax.set_mesh(mesh):
        got = quick_jit(lambda x: int4_linear(x, *params, use_kernel=True, interpret=True))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 64, 512])
@pytest.mark.parametrize("num_in, num_out", [(4096, 14336), (14336, 4096)], ids=["gate", "down"])
def test_compiled_kernel_at_llama_8b_shapes(num_rows, num_in, num_out):
    """Triton-compiled at Llama-3.1-8B's MLP shapes (groups of 128), within bfloat16 rounding of
    the jnp product, and the jitted call holds the kernel (no dequantized weight copy)."""
    packed, scale, zero = _weights(num_in, num_out, 128, zeros=True)
    scale = scale.astype(jnp.bfloat16)
    x = jax.random.normal(jax.random.key(4), (num_rows, num_in), jnp.bfloat16)
    call = jax.jit(lambda x, p, s, z: int4_matmul(x, p, s, z, group_size=128))
    hlo = call.lower(x, packed, scale, zero).compile().as_text()
    assert "int4_matmul" in hlo
    got = np.asarray(call(x, packed, scale, zero), np.float32)
    want = np.asarray(dequantized_matmul(x.astype(jnp.float32), packed, scale.astype(jnp.float32), zero))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
