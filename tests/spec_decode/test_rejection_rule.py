"""The verification rule against the target distribution, by chi-square over many draws on a
tiny vocabulary: with the real sampler drawing at each sampling position (its key
fold_in(key(seed), position)), the step counting each row's rejected drafts and the runner
keeping drafts up to the first mismatch,

- the first output token follows the target p0 whatever the draft,
- the draft is accepted with probability p0(draft), and a rejected draft gives a token from
  p0 without the draft, renormalized (the standard rejection rule for a one-token draft),
- after an accepted draft, the next token follows p1.

Power: 20000 requests; at p = 0.001 the chi-square tests (5 and 4 degrees of freedom) detect
a shift of 0.02 in any token's probability with power above 0.99, the acceptance z-test a
shift of 0.015.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers.sampling_metadata import make_metadata
from vjx.sampling.sampler import sample
from vjx.spec_decode.sample_positions import accepted_tokens, num_rejected_drafts
from vjx.worker.step_outputs import StepRecord

_NUM_REQUESTS = 20000
_P0_LOGITS = np.array([1.0, 0.3, -0.2, 0.6, -1.0, 0.0], np.float32)
_P1_LOGITS = np.array([-0.5, 0.8, 0.1, -0.1, 0.4, -1.2], np.float32)
_DRAFT = 3
_CRITICAL = {5: 20.52, 4: 18.47}
"""Chi-square at p = 0.001, by degrees of freedom."""


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


def _chi_square(observed_tokens: np.ndarray, expected_p: np.ndarray) -> float:
    expected = expected_p * len(observed_tokens)
    observed = np.bincount(observed_tokens, minlength=len(expected_p))
    kept = expected > 0
    assert observed[~kept].sum() == 0, "a token of probability 0 was drawn"
    return float(((observed[kept] - expected[kept]) ** 2 / expected[kept]).sum())


def _verify_one_draft() -> list[list[int]]:
    """Each request: its last token then one draft, two sampling positions (output positions
    0 and 1), each request with its own seed."""
    n = _NUM_REQUESTS
    logits = np.stack([_P0_LOGITS, _P1_LOGITS] * n)
    seeds = np.repeat(np.arange(n), 2)
    positions = np.tile([0, 1], n)
    md = make_metadata(2 * n, len(_P0_LOGITS), seeds=seeds, sample_positions=positions)
    sampled = jax.jit(sample)(logits, md)
    # The step's fields for n rows of two tokens (the last one, then the draft) and two
    # sampling positions each; the device counts each row's rejected drafts.
    fields = {
        "spec_sample_rows": jnp.repeat(jnp.arange(n), 2),
        "spec_sample_offsets": jnp.tile(jnp.arange(2), n),
        "spec_logits_indices": jnp.arange(2 * n),
        "spec_num_tokens": jnp.ones(2 * n, jnp.int32),
    }
    input_ids = jnp.tile(jnp.array([0, _DRAFT]), n)
    layout = types.SimpleNamespace(max_num_reqs=n, num_spec_tokens=1)
    num_rejected = jax.jit(functools.partial(num_rejected_drafts, layout))(fields, sampled, input_ids)
    record = StepRecord(
        req_ids=[str(i) for i in range(n)],
        rows=np.arange(n),
        slot_versions=np.zeros(n),
        is_sampling=np.ones(n, bool),
        num_logprobs=np.full(n, -1),
        may_send_prompt_logprobs=np.zeros(n, bool),
        token_rows=np.arange(n),
        has_prompt_target=np.zeros(n, bool),
        drafts=[[_DRAFT]] * n,
        sample_starts=np.arange(0, 2 * n, 2),
    )
    return accepted_tokens(record, np.concatenate([sampled, num_rejected]), 2 * n)


def test_accepted_tokens_follow_the_target_distribution():
    outputs = _verify_one_draft()
    p0, p1 = _softmax(_P0_LOGITS), _softmax(_P1_LOGITS)
    first = np.array([tokens[0] for tokens in outputs])
    assert _chi_square(first, p0) < _CRITICAL[5]

    is_accepted = np.array([len(tokens) == 2 for tokens in outputs])
    assert (first[is_accepted] == _DRAFT).all() and (first[~is_accepted] != _DRAFT).all()
    rate, expected_rate = is_accepted.mean(), p0[_DRAFT]
    z = (rate - expected_rate) / np.sqrt(expected_rate * (1 - expected_rate) / _NUM_REQUESTS)
    assert abs(z) < 3.29, f"acceptance rate {rate:.4f}, expected {expected_rate:.4f}"

    recovered = np.where(np.arange(len(p0)) == _DRAFT, 0.0, p0)
    recovered /= recovered.sum()
    assert _chi_square(first[~is_accepted], recovered) < _CRITICAL[4]

    second = np.array([tokens[1] for tokens in outputs if len(tokens) == 2])
    assert _chi_square(second, p1) < _CRITICAL[5]
