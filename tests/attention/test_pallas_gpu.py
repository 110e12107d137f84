"""PallasGpuBackend (interpret mode on CPU) against the reference backend, and its KV write."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, make_batch, relative_error
from vjx.attention.pallas_gpu import PallasGpuBackend
from vjx.attention.reference import ReferenceBackend
from vjx.kernels.kv_cache_write import write_kv_cache
from vjx.kernels.tuning import AttentionTuning, KernelTuning

SHAPE = BatchShape(num_tokens=64, num_rows=4, num_heads=8, num_kv_heads=2, head_dim=64, page_size=16, max_model_len=128)
REQUESTS = [(20, 1), (50, 30), (0, 12), (100, 1)]
BACKEND = PallasGpuBackend(
    tuning=AttentionTuning(
        decode=KernelTuning(block_k=16), prefill=KernelTuning(block_m=32, block_k=16), decode_programs=8
    )
)


def _to_reference_layout(kv_cache):
    """[2, K, P, S, H] -> the reference's [2, P, S, K, H]."""
    return jnp.transpose(kv_cache, (0, 2, 3, 1, 4))


@functools.partial(jax.jit, static_argnames=("backend",), donate_argnames=("kv_cache",))
def _forward(backend, q, k, v, kv_cache, md):
    return backend.forward(q, k, v, kv_cache, md, sm_scale=0.125)


def _stale_batch():
    """A batch whose new tokens' cache slots still hold stale values, so the write matters."""
    batch = make_batch(REQUESTS, SHAPE, seed=3)
    kv_cache = batch.kv_cache.copy()
    slots = np.asarray(batch.md.slot_mapping)[: batch.real_tokens()]
    pages, offsets = slots // SHAPE.page_size, slots % SHAPE.page_size
    kv_cache[:, :, pages, offsets] = -7.0
    return batch, kv_cache


def test_matches_reference_backend_and_writes_the_cache():
    batch, stale_cache = _stale_batch()
    q, k, v = (jnp.asarray(x) for x in (batch.q, batch.k, batch.v))
    out, kv_cache = _forward(BACKEND, q, k, v, jnp.asarray(stale_cache), batch.md)
    # The reference reads whole chunks of pages, so it gets zeros where this backend gets NaN.
    reference_cache = _to_reference_layout(jnp.nan_to_num(jnp.asarray(stale_cache)))
    ref_out, ref_cache = _forward(ReferenceBackend(), q, k, v, reference_cache, batch.md)
    num_real = batch.real_tokens()
    assert relative_error(np.asarray(out)[:num_real], np.asarray(ref_out, np.float64)[:num_real]) < 1e-5
    assert np.all(np.asarray(out)[num_real:] == 0.0)
    # Outside block 0 (the padding tokens' scratch) the caches agree, NaN where never written.
    np.testing.assert_array_equal(np.asarray(kv_cache)[:, :, 1:], batch.kv_cache[:, :, 1:])
    ours_as_reference = np.nan_to_num(np.asarray(_to_reference_layout(kv_cache)))
    np.testing.assert_array_equal(ours_as_reference[:, 1:], np.asarray(ref_cache)[:, 1:])


@pytest.mark.parametrize("num_kv_heads, dtype", [(4, jnp.float32), (1, jnp.float32), (1, jnp.bfloat16)])
def test_kv_write_updates_the_donated_cache_in_place(num_kv_heads, dtype):
    """The optimized HLO of the donated write copies no cache-sized buffer (one kv head, as a
    device holds at high TP, included)."""
    cache = jax.ShapeDtypeStruct((2, num_kv_heads, 64, 16, 64), dtype)
    rows = jax.ShapeDtypeStruct((32, num_kv_heads, 64), dtype)
    slots = jax.ShapeDtypeStruct((32,), jnp.int32)
    compiled = jax.jit(write_kv_cache, donate_argnums=0).lower(cache, rows, rows, slots).compile()
    hlo = compiled.as_text()
    copied = [
        shape
        for shape in re.findall(r"= \w+\[([\d,]+)\]\{[^}]*\} copy\(", hlo)
        if math.prod(int(d) for d in shape.split(",")) == math.prod(cache.shape)
    ]
    assert "input_output_alias" in hlo and not copied


def test_forward_donates_the_cache():
    batch = make_batch(REQUESTS, SHAPE)
    q, k, v, kv_cache = batch.device_arrays()
    _forward(BACKEND, q, k, v, kv_cache, batch.md)
    assert kv_cache.is_deleted()


def test_kv_cache_shape_and_identity():
    assert PallasGpuBackend().kv_cache_shape(10, 16, 2, 64) == (2, 2, 10, 16, 64)
    assert PallasGpuBackend.name == "pallas_gpu"
    assert hash(BACKEND) == hash(PallasGpuBackend(tuning=BACKEND.tuning))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"sliding_window": 0}, "sliding_window"), ({"soft_cap": 0.0}, "soft_cap")],
)
def test_bad_arguments_raise(kwargs, argument):
    batch = make_batch(REQUESTS, SHAPE)
    q, k, v, kv_cache = batch.device_arrays()
    with pytest.raises(ValueError, match=argument):
        BACKEND.forward(q, k, v, kv_cache, batch.md, sm_scale=1.0, **kwargs)
