"""Builders shared by the sampling tests: metadata with neutral defaults, and numpy references
of the logits processors written the way vLLM states them (loops over rows and words)."""

import jax.numpy as jnp
import numpy as np

from vjx.worker.step_inputs import STEP_INPUTS

_NEUTRAL = dict(
    temperature=(1.0, np.float32),
    top_k=(0, np.int32),
    top_p=(1.0, np.float32),
    min_p=(0.0, np.float32),
    seeds=(0, np.int32),
    sample_positions=(0, np.int32),
    presence_penalty=(0.0, np.float32),
    frequency_penalty=(0.0, np.float32),
    repetition_penalty=(1.0, np.float32),
    num_prompt_tokens=(0, np.int32),
    num_tokens=(1, np.int32),  # a real row (0 marks a padding row)
    has_logit_bias=(False, np.bool_),
    is_below_min_tokens=(False, np.bool_),
)


def make_metadata(
    num_rows,
    vocab_size,
    *,
    all_greedy=False,
    token_ids=None,
    logit_bias=None,
    stop_token_ids=None,
    bad_words=None,
    grammar_bans=None,
    **per_row,
):
    """Every processor off unless given; per-row fields broadcast to [num_rows]."""
    fields = {}
    for name, (neutral, dtype) in _NEUTRAL.items():
        value = np.asarray(per_row.pop(name, neutral), dtype)
        fields[name] = jnp.asarray(np.broadcast_to(value, (num_rows,)))
    assert not per_row, f"unknown fields {sorted(per_row)}"
    arrays = dict(
        token_ids=(token_ids, (num_rows, 1), 0, np.int32),
        logit_bias=(logit_bias, (num_rows, vocab_size), 0.0, np.float32),
        stop_token_ids=(stop_token_ids, (num_rows, 1), -1, np.int32),
        bad_words=(bad_words, (num_rows, 1, 1), -1, np.int32),
        grammar_bans=(grammar_bans, (num_rows, -(-vocab_size // 32)), 0, np.int32),
    )
    for name, (value, shape, fill, dtype) in arrays.items():
        fields[name] = jnp.asarray(np.full(shape, fill, dtype) if value is None else np.asarray(value, dtype))
    fields["logit_bias_rows"] = jnp.arange(num_rows, dtype=jnp.int32)
    return STEP_INPUTS.sampling_metadata_class(**fields, all_greedy=all_greedy)


def pad_rows(lists, fill, width=None):
    """Ragged int lists -> [len(lists), width] int32, left-aligned, padded with `fill`."""
    width = width or max(1, max(len(x) for x in lists))
    out = np.full((len(lists), width), fill, np.int32)
    for row, values in enumerate(lists):
        out[row, : len(values)] = values
    return out


def right_aligned_words(words_per_row, num_words, word_len):
    """[R, B, W] int32: each word right-aligned, -1 on its left and for missing words."""
    out = np.full((len(words_per_row), num_words, word_len), -1, np.int32)
    for row, words in enumerate(words_per_row):
        for b, word in enumerate(words):
            out[row, b, word_len - len(word) :] = word
    return out


def reference_penalties(logits, prompt, output, presence, frequency, repetition):
    """vLLM's penalties on one float32 row; prompt and output are token lists."""
    x = logits.astype(np.float32).copy()
    seen = np.zeros(len(x), bool)
    seen[list(prompt) + list(output)] = True
    counts = np.bincount(np.asarray(output, np.int64), minlength=len(x)).astype(np.float32)
    scale = np.where(x > 0, np.float32(1.0) / np.float32(repetition), np.float32(repetition))
    x = np.where(seen, x * scale, x).astype(np.float32)
    x = x - np.float32(frequency) * counts
    return x - np.float32(presence) * (counts > 0).astype(np.float32)


def reference_bad_words(logits, words, output):
    """vLLM's rule on one row: ban a word's last token when its prefix ends the output."""
    x = logits.copy()
    for word in words:
        prefix = list(word[:-1])
        if len(prefix) > len(output):
            continue
        if not prefix or list(output[len(output) - len(prefix) :]) == prefix:
            x[word[-1]] = -np.inf
    return x
