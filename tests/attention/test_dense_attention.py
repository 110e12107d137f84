"""vjx.training's DenseAttentionBackend against the float64 oracle on fresh prefills (no
cached keys: a learner's whole sequences), with grouped KV heads, a sliding window, a soft cap
and sinks, padding tokens after the rows; and its gradient is finite (reverse mode runs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch
from vjx.training import DenseAttentionBackend

SHAPE = BatchShape(num_tokens=40, num_rows=4, num_heads=4, num_kv_heads=2, head_dim=8, page_size=8, max_model_len=32)
REQUESTS = [(0, 13), (0, 1), (0, 21)]


@pytest.mark.parametrize(
    "options",
    [{}, {"sliding_window": 5}, {"soft_cap": 3.0}, {"sinks": np.linspace(-1, 1, 4, dtype=np.float32)}],
    ids=["plain", "window", "soft_cap", "sinks"],
)
def test_dense_attention_equals_the_oracle(options):
    batch = make_batch(REQUESTS, SHAPE)
    q, k, v, _ = batch.device_arrays()
    sinks = options.get("sinks")
    out, _ = DenseAttentionBackend().forward(
        q,
        k,
        v,
        jnp.zeros((0,)),
        batch.md,
        sm_scale=0.3,
        sliding_window=options.get("sliding_window"),
        soft_cap=options.get("soft_cap"),
        sinks=None if sinks is None else jnp.asarray(sinks),
    )
    expected = dense_attention(batch, 0.3, options.get("sliding_window"), options.get("soft_cap"), sinks)
    num_real = batch.real_tokens()
    np.testing.assert_allclose(np.asarray(out)[:num_real], expected[:num_real], atol=1e-5, rtol=0)


def test_dense_attention_has_a_gradient():
    batch = make_batch(REQUESTS, SHAPE)
    q, k, v, _ = batch.device_arrays()

    def loss(q, k, v):
        out, _ = DenseAttentionBackend().forward(q, k, v, jnp.zeros((0,)), batch.md, sm_scale=0.3)
        return (out[: batch.real_tokens()] ** 2).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert all(bool(jnp.isfinite(g).all()) and float(jnp.abs(g).max()) > 0 for g in grads)
