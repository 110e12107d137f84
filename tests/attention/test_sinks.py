"""Attention sinks (gpt-oss): each query head's sink is a logit with no value in its softmax.

Every backend against a float64 numpy softmax whose denominator holds the head's sink, on one
ragged step: decode rows the Pallas kernel splits into segments (an empty one included) and
one it does not, a chunked prefill and a prefill. The sinks span logits far below and above
the rows' own, so some heads barely notice them and others attend mostly to nothing.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from tests.helpers.quick_compile import quick_jit
from vjx.attention.cpu import CpuBackend
from vjx.attention.pallas_gpu import PallasGpuBackend
from vjx.attention.pallas_tpu import PallasTpuBackend
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.kernels.tuning import AttentionTuning, KernelTuning
from vjx.sharding.mesh import make_mesh

SHAPE = BatchShape(num_tokens=64, num_rows=5, num_heads=8, num_kv_heads=2, head_dim=32, page_size=8, max_model_len=256)
# 5 rows, 20 decode programs, 16-key tiles: 4 segments at most. The 71-key row takes 4 of 32
# keys (the last empty), the 201-key row 4, the 4-key row 1.
REQUESTS = [(3, 1), (50, 30), (0, 12), (70, 1), (200, 1)]
SM_SCALE = 0.5
SINKS = np.linspace(-4.0, 10.0, SHAPE.num_heads, dtype=np.float32)
BACKENDS = {
    "reference": ReferenceBackend(keys_per_chunk=32),  # several chunks per row
    "cpu": CpuBackend(query_block=16, keys_per_chunk=32),  # both of its paths
    "pallas_gpu": PallasGpuBackend(
        tuning=AttentionTuning(
            decode=KernelTuning(block_k=16),
            prefill=KernelTuning(block_m=32, block_k=16),
            decode_programs=20,
            min_tiles_per_split=1,
        ),
        interpret=True,
    ),
}


@functools.partial(quick_jit, static_argnames=("backend", "sliding_window", "soft_cap"))
def _forward(backend, q, k, v, kv_cache, md, sinks, sliding_window=None, soft_cap=None):
    return backend.forward(
        q, k, v, kv_cache, md, sm_scale=SM_SCALE, sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks
    )


def _in_layout(backend, kv_cache: np.ndarray) -> jax.Array:
    """The batch's [2, K, P, S, H] cache in the backend's layout. The jnp backends read whole
    chunks of pages, so they get zeros where the Pallas kernel keeps the NaN poison."""
    if backend.name in ("reference", "cpu"):
        return jnp.transpose(jnp.asarray(np.nan_to_num(kv_cache)), (0, 2, 3, 1, 4))
    return jnp.asarray(kv_cache)


def _run(backend, batch, sinks, sliding_window=None, soft_cap=None) -> np.ndarray:
    q, k, v = (jnp.asarray(x) for x in (batch.q, batch.k, batch.v))
    sinks = None if sinks is None else jnp.asarray(sinks)
    kv_cache = _in_layout(backend, batch.kv_cache)
    out, _ = _forward(backend, q, k, v, kv_cache, batch.md, sinks, sliding_window, soft_cap)
    return np.asarray(out)


@pytest.fixture(scope="module")
def batch():
    return make_batch(REQUESTS, SHAPE, seed=5)


@pytest.mark.parametrize(("window", "cap"), [(None, None), (37, 5.0)])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_matches_dense_attention_with_sinks(name, window, cap, batch):
    out = _run(BACKENDS[name], batch, SINKS, window, cap)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, SM_SCALE, window, cap, sinks=SINKS)
    assert relative_error(out[:num_real], expected[:num_real]) < 1e-5
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"
    without_sinks = dense_attention(batch, SM_SCALE, window, cap)
    assert relative_error(out[:num_real], without_sinks[:num_real]) > 0.1, "the sinks must bite"


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_sink_that_weighs_nothing_changes_nothing(name, batch):
    """sinks=None attends as before; a sink of -1e30 (exp underflows to 0 against every key,
    as in the Pallas kernel's segments after the first) gives the same bits."""
    backend = BACKENDS[name]
    out = _run(backend, batch, None)
    num_real = batch.real_tokens()
    assert relative_error(out[:num_real], dense_attention(batch, SM_SCALE)[:num_real]) < 1e-5
    no_weight = np.full(SHAPE.num_heads, -1e30, np.float32)
    np.testing.assert_array_equal(_run(backend, batch, no_weight), out)


def test_sharded_backend_splits_the_sinks_with_the_heads():
    """Tensor parallelism 8: each device attends with the sinks of its own two query heads."""
    shape = BatchShape(64, 5, num_heads=16, num_kv_heads=8, head_dim=32, page_size=8, max_model_len=256)
    batch = make_batch(REQUESTS, shape, seed=6)
    sinks = np.linspace(-4.0, 10.0, shape.num_heads, dtype=np.float32)
    backend = BACKENDS["cpu"]
    expected = _run(backend, batch, sinks, 37, 5.0)
    with jax.set_mesh(make_mesh(ParallelConfig(tensor_parallel_size=8))):
        out = _run(ShardedBackend(backend), batch, sinks, 37, 5.0)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    num_real = batch.real_tokens()
    assert relative_error(out[:num_real], dense_attention(batch, SM_SCALE, 37, 5.0, sinks=sinks)[:num_real]) < 1e-5


def test_tpu_backend_refuses_sinks(batch):
    backend = PallasTpuBackend(use_reference=True)
    q, k, v = (jnp.asarray(x) for x in (batch.q, batch.k, batch.v))
    kv_pages = jnp.zeros(backend.kv_cache_shape(8, SHAPE.page_size, SHAPE.num_kv_heads, SHAPE.head_dim))
    with pytest.raises(ValueError, match="sinks"):
        backend.forward(q, k, v, kv_pages, batch.md, sm_scale=SM_SCALE, sinks=jnp.asarray(SINKS))


@pytest.mark.gpu
@pytest.mark.parametrize(("window", "cap"), [(None, None), (1000, 30.0)])
def test_compiled_kernels_apply_sinks_on_the_gpu(window, cap):
    """The Triton-compiled kernels at real sizes and the shipped knobs (decode rows of
    thousands of keys split into many segments, prefill rows over many query blocks)."""
    shape = BatchShape(1280, 8, 32, 8, 128, 16, 4608)
    batch = make_batch([(4000, 1), (2500, 1), (4400, 1), (1000, 300), (0, 700), (33, 200)], shape, jnp.bfloat16)
    sinks = np.linspace(-2.0, 12.0, shape.num_heads, dtype=np.float32)
    q, k, v, kv_cache = batch.device_arrays()
    out, _ = PallasGpuBackend().forward(
        q, k, v, kv_cache, batch.md, sm_scale=128**-0.5, sliding_window=window, soft_cap=cap, sinks=jnp.asarray(sinks)
    )
    out = np.asarray(out, np.float32)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, 128**-0.5, window, cap, sinks=sinks)
    assert relative_error(out[:num_real], expected[:num_real]) < 2e-2
    assert np.all(out[num_real:] == 0.0)
    without_sinks = dense_attention(batch, 128**-0.5, window, cap)
    assert relative_error(out[:num_real], without_sinks[:num_real]) > 0.1, "the sinks must bite"
