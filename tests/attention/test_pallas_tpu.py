"""PallasTpuBackend on CPU: layout conversion, the KV write, and the adapter's mapping of vjx's
metadata onto the TPU kernel's arguments, checked through JAX's jnp reference of that kernel
(the kernel itself needs a TPU: its DMAs do not run in CPU interpret mode)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from tests.helpers.tpu_layout import from_gpu_layout, to_gpu_layout
from vjx.attention.pallas_tpu import PallasTpuBackend

SHAPE = BatchShape(num_tokens=64, num_rows=4, num_heads=8, num_kv_heads=2, head_dim=32, page_size=8, max_model_len=128)
REQUESTS = [(20, 1), (50, 30), (0, 12)]


def test_layout_round_trip_and_meaning():
    kv_cache = np.random.default_rng(0).standard_normal((2, 3, 5, 4, 8)).astype(np.float32)
    kv_pages = np.asarray(from_gpu_layout(jnp.asarray(kv_cache)))
    assert kv_pages.shape == (5, 4, 6, 8)
    # Page 2, slot 1: kv head 1's key is combined head 2, its value combined head 3.
    np.testing.assert_array_equal(kv_pages[2, 1, 2], kv_cache[0, 1, 2, 1])
    np.testing.assert_array_equal(kv_pages[2, 1, 3], kv_cache[1, 1, 2, 1])
    np.testing.assert_array_equal(np.asarray(to_gpu_layout(jnp.asarray(kv_pages))), kv_cache)


@pytest.mark.parametrize(("window", "cap"), [(None, None), (17, 4.0)])
def test_writes_and_attends_like_the_dense_oracle(window, cap):
    batch = make_batch(REQUESTS, SHAPE, seed=4)
    stale = np.nan_to_num(batch.kv_cache)
    slots = np.asarray(batch.md.slot_mapping)[: batch.real_tokens()]
    stale[:, :, slots // SHAPE.page_size, slots % SHAPE.page_size] = -7.0  # the write must fix these
    q, k, v = (jnp.asarray(x) for x in (batch.q, batch.k, batch.v))
    kv_pages = from_gpu_layout(jnp.asarray(stale))
    out, kv_pages = PallasTpuBackend(use_reference=True).forward(
        q, k, v, kv_pages, batch.md, sm_scale=0.2, sliding_window=window, soft_cap=cap
    )
    written = np.asarray(to_gpu_layout(kv_pages))
    np.testing.assert_array_equal(written[:, :, 1:], np.nan_to_num(batch.kv_cache)[:, :, 1:])
    num_real = batch.real_tokens()
    expected = dense_attention(batch, 0.2, sliding_window=window, soft_cap=cap)
    assert relative_error(np.asarray(out)[:num_real], expected[:num_real]) < 1e-5
    assert np.all(np.asarray(out)[num_real:] == 0.0)


def test_kv_cache_shape_and_identity():
    assert PallasTpuBackend().kv_cache_shape(10, 16, 2, 128) == (10, 16, 4, 128)
    assert PallasTpuBackend.name == "pallas_tpu"
    assert hash(PallasTpuBackend()) == hash(PallasTpuBackend())
