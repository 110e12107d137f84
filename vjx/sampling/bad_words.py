"""Bad words: a word's last token cannot be drawn right after the word's other tokens.

Legend: R sampled rows, V vocab, L token history length, B bad words per row, W tokens per
bad word.

As in vLLM, a word of n tokens bans its last token when its first n - 1 tokens are the
row's last n - 1 OUTPUT tokens (the prompt never completes a bad word); a one-token word is
always banned. Words are right-aligned in `md.bad_words`, so word column c faces the row's
token at `num_tokens - (W - 1) + c` and the match is one elementwise compare, whatever the
word's length: the -1 padding on a word's left matches anything.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from vjx.sampling.metadata import SamplingMetadata

_NOT_OUTPUT = -2
"""Stands for history columns outside the row's output: equal to no token and no padding."""


def has_bad_words(md: SamplingMetadata) -> Bool[Array, ""]:
    """Whether any real row (one with a history) has a bad word."""
    return jnp.any((md.bad_words[:, :, -1] >= 0) & (md.num_tokens > 0)[:, None])


def apply_bad_words(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    """The logits with every banned last token set to -inf."""
    num_rows, vocab_size = logits.shape
    last_RB = md.bad_words[:, :, -1]
    is_banned_RB = _prefix_matches(md) & (last_RB >= 0) & (last_RB < vocab_size) & (md.num_tokens > 0)[:, None]
    # Words not banned scatter to column V, which `mode="drop"` discards.
    index_RB = jnp.where(is_banned_RB, last_RB, vocab_size)
    rows_R1 = jnp.arange(num_rows, dtype=jnp.int32)[:, None]
    return logits.at[rows_R1, index_RB].set(-jnp.inf, mode="drop")


def _prefix_matches(md: SamplingMetadata) -> Bool[Array, "R B"]:
    """Whether each word's tokens but its last are the row's last output tokens.

    The `_RW` arrays hold the W - 1 columns of the words' prefixes."""
    history_len = md.token_ids.shape[1]
    prefix_len = md.bad_words.shape[-1] - 1
    position_RW = md.num_tokens[:, None] - prefix_len + jnp.arange(prefix_len, dtype=jnp.int32)
    tail_RW = jnp.take_along_axis(md.token_ids, jnp.clip(position_RW, 0, history_len - 1), axis=1)
    tail_RW = jnp.where(position_RW >= md.num_prompt_tokens[:, None], tail_RW, _NOT_OUTPUT)
    prefix_RBW = md.bad_words[:, :, :-1]
    return jnp.all((prefix_RBW == -1) | (prefix_RBW == tail_RW[:, None, :]), axis=-1)
