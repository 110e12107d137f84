"""Structured outputs on the device: each row's grammar allows some tokens, the rest get -inf.

Legend: R sampled rows, V vocab, M = ceil(V / 32) bitmask words.

The engine core packs each constrained row's allowed tokens into int32 words (bit v % 32 of
word v // 32 allows token v), as llguidance fills them; the runner sends their complement,
`grammar_bans` (a set bit bans the token), so that a row of zeros constrains nothing. The
mask comes first in the pipeline, so every later processor, greedy or random draw sees only
tokens the grammar allows.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from vjx.sampling.metadata import SamplingMetadata


def has_grammar_bans(md: SamplingMetadata) -> Bool[Array, ""]:
    return jnp.any(md.grammar_bans != 0)


def apply_grammar_bans(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    num_rows, vocab_size = logits.shape
    bits = jnp.arange(32, dtype=jnp.int32)
    is_banned_RM32 = (md.grammar_bans[:, :, None] >> bits) & 1
    is_banned_RV = is_banned_RM32.reshape(num_rows, -1)[:, :vocab_size].astype(bool)
    return jnp.where(is_banned_RV, -jnp.inf, logits)
