"""Logit bias and allowed tokens: one dense additive bias per row.

Legend: R sampled rows, V vocab.

The runner folds a request's `logit_bias` (token -> bias, clamped to [-100, 100]) and its
`allowed_token_ids` (-inf for every other token) into one float32 row of a [N, V] table, so
both are one add here. The add gathers [R, V] from the table, so it runs only when some row
has a bias.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from vjx.sampling.metadata import SamplingMetadata


def has_logit_bias(md: SamplingMetadata) -> Bool[Array, ""]:
    return jnp.any(md.has_logit_bias)


def apply_logit_bias(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    """The logits plus the bias of each row that has one (-inf on tokens it does not allow)."""
    bias_RV = md.logit_bias[md.logit_bias_rows]
    return jnp.where(md.has_logit_bias[:, None], logits + bias_RV, logits)
