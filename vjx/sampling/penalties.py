"""Repetition, frequency and presence penalties, with vLLM's (and OpenAI's) semantics.

Legend: R sampled rows, V vocab, L token history length.

For every token of the vocabulary, with `seen` = it occurs in the row's prompt or output
and `count` = its occurrences in the row's OUTPUT:
  1. repetition: a seen token's logit is multiplied by 1 / repetition_penalty when it is
     positive, by repetition_penalty otherwise;
  2. frequency: minus frequency_penalty x count;
  3. presence: minus presence_penalty x (count > 0).
`seen` and `count` come from two scatters of the row's history into dense [R, V] tables:
no sort of the history, and a cost that does not depend on which tokens repeat.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from vjx.sampling.metadata import SamplingMetadata


def has_penalties(md: SamplingMetadata) -> Bool[Array, ""]:
    """Whether any real row (one with a history) has a non-neutral penalty."""
    is_penalized_R = (md.repetition_penalty != 1.0) | (md.frequency_penalty != 0.0) | (md.presence_penalty != 0.0)
    return jnp.any(is_penalized_R & (md.num_tokens > 0))


def apply_penalties(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    """The float32 logits with the three penalties applied, in the module docstring's order."""
    is_seen_RV, output_counts_RV = token_counts(md, logits.shape[-1])
    repetition_R1 = md.repetition_penalty[:, None]
    # Multiplying by the reciprocal (not dividing) matches vLLM to the bit.
    scale_RV = jnp.where(logits > 0, 1.0 / repetition_R1, repetition_R1)
    logits = jnp.where(is_seen_RV, logits * scale_RV, logits)
    logits = logits - md.frequency_penalty[:, None] * output_counts_RV.astype(jnp.float32)
    return logits - md.presence_penalty[:, None] * (output_counts_RV > 0).astype(jnp.float32)


def token_counts(md: SamplingMetadata, vocab_size: int) -> tuple[Bool[Array, "R V"], Int[Array, "R V"]]:
    """(token occurs in prompt or output, int32 occurrences in the output) per row and token."""
    num_rows, history_len = md.token_ids.shape
    position_RL = jnp.arange(history_len, dtype=jnp.int32)[None, :]
    is_valid_RL = (position_RL < md.num_tokens[:, None]) & (md.token_ids >= 0) & (md.token_ids < vocab_size)
    is_output_RL = is_valid_RL & (position_RL >= md.num_prompt_tokens[:, None])
    rows_R1 = jnp.arange(num_rows, dtype=jnp.int32)[:, None]
    # Ignored entries scatter to column V, which `mode="drop"` discards.
    seen_index_RL = jnp.where(is_valid_RL, md.token_ids, vocab_size)
    output_index_RL = jnp.where(is_output_RL, md.token_ids, vocab_size)
    is_seen_RV = jnp.zeros((num_rows, vocab_size), jnp.bool_).at[rows_R1, seen_index_RL].set(True, mode="drop")
    output_counts_RV = jnp.zeros((num_rows, vocab_size), jnp.int32).at[rows_R1, output_index_RL].add(1, mode="drop")
    return is_seen_RV, output_counts_RV
