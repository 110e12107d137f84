"""compute_logprobs against numpy: log-softmax, top-k columns, vLLM's ranks with ties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vjx.sampling.logprobs import compute_logprobs

V = 64
_compute_logprobs = jax.jit(compute_logprobs, static_argnums=2)


def _log_softmax(logits):
    x = logits.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_logprobs_match_numpy_log_softmax():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(16, V)) * 4).astype(np.float32)
    chosen = rng.integers(0, V, 16).astype(np.int32)
    ids, logprobs, ranks = map(np.asarray, _compute_logprobs(logits, chosen, 5))
    expected = _log_softmax(logits)
    assert ids.dtype == np.int32 and logprobs.dtype == np.float32 and ranks.dtype == np.int32
    assert ids.shape == logprobs.shape == (16, 6)
    np.testing.assert_array_equal(ids[:, 0], chosen)
    np.testing.assert_array_equal(ids[:, 1:], np.argsort(-expected, axis=-1, kind="stable")[:, :5])
    np.testing.assert_allclose(logprobs, np.take_along_axis(expected, ids, axis=-1), atol=1e-5)
    np.testing.assert_array_equal(ranks, (expected > expected[np.arange(16), chosen][:, None]).sum(-1) + 1)


def test_ranks_count_tied_tokens_ahead_as_vllm_does():
    logits = np.zeros((4, V), np.float32)
    logits[:, :3] = 2.0  # three tokens tie for first place
    logits[:, 3] = 1.0
    ids, logprobs, ranks = map(np.asarray, _compute_logprobs(logits, np.array([0, 2, 3, 10], np.int32), 2))
    np.testing.assert_array_equal(ranks, [3, 3, 4, V])
    np.testing.assert_array_equal(ids[:, 1:], [[0, 1]] * 4)  # ties: the lower id first
    np.testing.assert_array_equal(logprobs[:, 1], logprobs[:, 2])


def test_zero_logprobs_return_the_chosen_token_alone():
    logits = np.random.default_rng(1).normal(size=(3, V)).astype(np.float32)
    ids, logprobs, ranks = _compute_logprobs(logits, np.array([5, 6, 7], np.int32), 0)
    assert ids.shape == logprobs.shape == (3, 1)
    np.testing.assert_allclose(logprobs[:, 0], _log_softmax(logits)[[0, 1, 2], [5, 6, 7]], atol=1e-5)


def test_bf16_logits_give_float32_logprobs():
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(2, V)), jnp.bfloat16)
    _, logprobs, _ = _compute_logprobs(logits, np.array([0, 1], np.int32), 3)
    assert logprobs.dtype == np.float32
    expected = _log_softmax(np.asarray(logits.astype(jnp.float32)))
    np.testing.assert_allclose(logprobs[:, 0], expected[[0, 1], [0, 1]], atol=1e-5)


def test_negative_num_logprobs_is_rejected():
    with pytest.raises(ValueError, match="num_logprobs must be >= 0, got -1"):
        compute_logprobs(jnp.zeros((1, V)), jnp.zeros(1, jnp.int32), -1)
