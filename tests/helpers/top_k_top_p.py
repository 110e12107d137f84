"""Top-k then top-p alone (temperature 1, no min-p), as the sampler's filter applies them."""

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from vjx.sampling.top_k_top_p import FilterParams, SubsetShape, filter_mask, filter_thresholds

_DEFAULT_SUBSET = SubsetShape()


def apply_top_k_top_p(
    logits: Float[Array, "R V"],
    top_k: Int[Array, " R"],
    top_p: Float[Array, " R"],
    subset: SubsetShape = _DEFAULT_SUBSET,
) -> Float[Array, "R V"]:
    """The float32 logits with every token that top-k, then top-p, drops set to -inf
    (temperature 1, no min-p)."""
    logits = lax.optimization_barrier(logits.astype(jnp.float32))
    ones_R = jnp.ones(logits.shape[:1], jnp.float32)
    params = FilterParams(ones_R, jnp.zeros_like(ones_R), top_k, top_p)
    thresholds = filter_thresholds(logits, logits, params, subset)
    return jnp.where(filter_mask(logits, logits, thresholds), logits, -jnp.inf)
