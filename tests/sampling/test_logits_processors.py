"""The logits processors (bias, allowed tokens, bad words, min_tokens, penalties) against
numpy references that follow vLLM's definitions."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers.quick_compile import quick_jit
from tests.helpers.sampling_metadata import (
    make_metadata,
    pad_rows,
    reference_bad_words,
    reference_penalties,
    right_aligned_words,
)
from vjx.sampling.bad_words import apply_bad_words, has_bad_words
from vjx.sampling.logit_bias import apply_logit_bias
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling.min_tokens import apply_min_tokens
from vjx.sampling.penalties import apply_penalties, has_penalties
from vjx.sampling.sampler import apply_logits_processors

V = 16
_apply_penalties = quick_jit(apply_penalties)
_apply_bad_words = quick_jit(apply_bad_words)
_apply_logits_processors = quick_jit(apply_logits_processors)

# (prompt, output): repeats inside the prompt, inside the output, and across both.
_HISTORIES = [
    ([1, 2, 2, 3], [3, 3, 4, 1]),
    ([5, 5, 5], []),
    ([0], [7, 7, 7, 7, 8]),
    ([9, 10, 11, 12, 13], [13, 9, 15]),
    ([4, 6], [6, 6, 2]),
    ([14], [14]),
]
_PENALTIES = [  # presence, frequency, repetition
    (0.0, 0.0, 1.3),
    (1.5, 0.0, 1.0),
    (0.0, 0.5, 1.0),
    (-0.5, -1.0, 0.7),
    (2.0, 2.0, 2.0),
    (0.3, -2.0, 1.1),
]


def _history_md(histories, history_len=12, **fields):
    """Metadata holding the histories, with garbage (ids out of range) past each row's end."""
    rows = [prompt + output for prompt, output in histories]
    token_ids = pad_rows(rows, fill=V + 3, width=history_len)
    token_ids[::2, -1] = -5
    return make_metadata(
        len(histories),
        V,
        token_ids=token_ids,
        num_prompt_tokens=[len(p) for p, _ in histories],
        num_tokens=[len(r) for r in rows],
        **fields,
    )


def _signed_logits(rng, num_rows):
    """Positive, negative and zero logits, and one -inf per row."""
    logits = rng.normal(size=(num_rows, V)).astype(np.float32) * 2
    logits[:, 0] = 0.0
    logits[:, -2] = -np.inf
    return logits


def test_penalties_match_the_vllm_reference():
    logits = _signed_logits(np.random.default_rng(0), len(_HISTORIES))
    presence, frequency, repetition = zip(*_PENALTIES)
    md = _history_md(_HISTORIES, presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition)
    got = np.asarray(_apply_penalties(logits, md))
    for row, ((prompt, output), params) in enumerate(zip(_HISTORIES, _PENALTIES)):
        expected = reference_penalties(logits[row], prompt, output, *params)
        np.testing.assert_array_equal(got[row], expected, err_msg=f"row {row}")


def test_repetition_divides_positive_and_multiplies_negative_logits():
    logits = np.array([[2.0, -2.0, 0.0, 3.0, -1.0] + [0.5] * (V - 5)], np.float32)
    md = _history_md([([0, 1], [2])], repetition_penalty=2.0)
    got = np.asarray(_apply_penalties(logits, md))[0]
    np.testing.assert_array_equal(got[:5], [1.0, -4.0, 0.0, 3.0, -1.0])


def test_frequency_and_presence_count_only_the_output():
    logits = np.zeros((1, V), np.float32)
    md = _history_md([([3, 3, 3, 5], [5, 6, 6, 6])], presence_penalty=0.5, frequency_penalty=0.25)
    got = np.asarray(_apply_penalties(logits, md))[0]
    assert got[3] == 0.0  # only in the prompt
    assert got[5] == -0.75  # once in the output
    assert got[6] == -1.25  # three times in the output


def test_penalties_run_only_when_a_real_row_has_one():
    assert not bool(has_penalties(_history_md(_HISTORIES)))
    assert bool(has_penalties(_history_md(_HISTORIES, frequency_penalty=[0, 0, 0, 0, 0, 0.1])))
    padding = make_metadata(4, V, num_tokens=0, repetition_penalty=0.0, presence_penalty=1.0)
    assert not bool(has_penalties(padding))


def test_logit_bias_and_allowed_tokens():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, V)).astype(np.float32)
    bias = np.zeros((4, V), np.float32)
    bias[0, [2, 7]] = [5.0, -100.0]  # logit_bias
    bias[1] = -np.inf
    bias[1, [3, 4]] = 0.0  # allowed_token_ids [3, 4]
    bias[1, 4] = 1.5  # and a bias on one of them
    bias[3] = 9.0  # a row that does not say it has a bias is left alone
    md = make_metadata(4, V, logit_bias=bias, has_logit_bias=[True, True, False, False])
    got = np.asarray(quick_jit(apply_logit_bias)(logits, md))
    expected = logits.copy()
    expected[:2] += bias[:2]
    np.testing.assert_array_equal(got, expected)
    assert np.isfinite(got[1]).sum() == 2


def test_min_tokens_masks_stop_tokens_only_below_min_tokens():
    logits = np.arange(3 * V, dtype=np.float32).reshape(3, V)
    stop = pad_rows([[0, 5], [1], [2, 3]], fill=-1)
    md = make_metadata(3, V, stop_token_ids=stop, is_below_min_tokens=[True, False, True])
    got = np.asarray(quick_jit(apply_min_tokens)(logits, md))
    expected = logits.copy()
    expected[0, [0, 5]] = -np.inf
    expected[2, [2, 3]] = -np.inf
    np.testing.assert_array_equal(got, expected)


def test_bad_words_follow_the_last_output_tokens():
    histories = [
        ([1, 2], [3, 4, 5]),  # [4, 5, 6]: prefix ends the output -> 6 banned
        ([4, 5], []),  # same prefix, but in the prompt -> not banned
        ([1], [5]),  # prefix spans prompt and output -> not banned
        ([1, 2], [4, 7]),  # prefix half matches -> not banned
        ([1, 2], []),  # one-token word -> always banned
        ([3], [9, 4, 5]),  # both words
    ]
    words = [[[4, 5, 6]], [[4, 5, 6]], [[4, 5, 6]], [[4, 5, 6]], [[11]], [[4, 5, 6], [12]]]
    md = _history_md(histories, bad_words=right_aligned_words(words, 2, 4))
    logits = np.zeros((len(histories), V), np.float32)
    got = np.isinf(np.asarray(_apply_bad_words(logits, md)))
    banned = [np.flatnonzero(row).tolist() for row in got]
    assert banned == [[6], [], [], [], [11], [6, 12]]


def test_bad_words_match_the_reference_on_random_histories():
    rng = np.random.default_rng(2)
    num_rows, vocab = 64, 4  # a tiny vocabulary makes matches common
    histories, words = [], []
    for _ in range(num_rows):
        prompt = rng.integers(0, vocab, rng.integers(1, 4)).tolist()
        output = rng.integers(0, vocab, rng.integers(0, 5)).tolist()
        histories.append((prompt, output))
        words.append([rng.integers(0, vocab, rng.integers(1, 5)).tolist() for _ in range(rng.integers(0, 4))])
    md = _history_md(histories, history_len=10, bad_words=right_aligned_words(words, 3, 4))
    logits = rng.normal(size=(num_rows, V)).astype(np.float32)
    got = np.asarray(_apply_bad_words(logits, md))
    for row, ((_, output), row_words) in enumerate(zip(histories, words)):
        np.testing.assert_array_equal(got[row], reference_bad_words(logits[row], row_words, output))
    assert 5 < np.isinf(got).sum() < num_rows * 3


def test_padding_rows_of_zeros_are_left_alone():
    zeros = jax.tree.map(jnp.zeros_like, make_metadata(4, V, bad_words=np.zeros((4, 2, 3))))
    assert isinstance(zeros, SamplingMetadata)
    assert not bool(has_bad_words(zeros)) and not bool(has_penalties(zeros))
    logits = np.random.default_rng(3).normal(size=(4, V)).astype(np.float32)
    np.testing.assert_array_equal(_apply_logits_processors(logits, zeros), logits)


def test_all_processors_compose_in_vllm_order():
    rng = np.random.default_rng(4)
    logits = _signed_logits(rng, len(_HISTORIES))
    bias = np.where(rng.random((len(_HISTORIES), V)) < 0.3, 1.25, 0.0).astype(np.float32)
    words = [[[3, 4, 8]], [[9]], [], [[13, 9, 15, 2]], [], [[14, 10]]]
    stop = pad_rows([[1], [2, 3], [], [0], [6], [7]], fill=-1)
    presence, frequency, repetition = zip(*_PENALTIES)
    md = _history_md(
        _HISTORIES,
        logit_bias=bias,
        has_logit_bias=True,
        bad_words=right_aligned_words(words, 1, 4),
        stop_token_ids=stop,
        is_below_min_tokens=[True, False] * 3,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
    )
    got = np.asarray(_apply_logits_processors(logits, md))
    for row, (prompt, output) in enumerate(_HISTORIES):
        expected = reference_bad_words(logits[row] + bias[row], words[row], output)
        if row % 2 == 0:
            expected[stop[row][stop[row] >= 0]] = -np.inf
        expected = reference_penalties(expected, prompt, output, *_PENALTIES[row])
        np.testing.assert_array_equal(got[row], expected, err_msg=f"row {row}")
