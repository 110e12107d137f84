"""min_tokens: a row below its min_tokens cannot draw EOS or its stop tokens.

Legend: R sampled rows, V vocab, K stop tokens per row.

The runner lists each row's stop tokens (EOS unless ignore_eos, and stop_token_ids) and
says which rows are below min_tokens; here those tokens get -inf.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from vjx.sampling.metadata import SamplingMetadata


def has_min_tokens(md: SamplingMetadata) -> Bool[Array, ""]:
    return jnp.any(md.is_below_min_tokens)


def apply_min_tokens(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    """The logits with the stop tokens of rows below min_tokens set to -inf."""
    num_rows, vocab_size = logits.shape
    stop_RK = md.stop_token_ids
    is_masked_RK = md.is_below_min_tokens[:, None] & (stop_RK >= 0) & (stop_RK < vocab_size)
    # Entries not masked scatter to column V, which `mode="drop"` discards.
    index_RK = jnp.where(is_masked_RK, stop_RK, vocab_size)
    rows_R1 = jnp.arange(num_rows, dtype=jnp.int32)[:, None]
    return logits.at[rows_R1, index_RK].set(-jnp.inf, mode="drop")
