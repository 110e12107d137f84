"""The on-device sampler: one token per sampled row, at the end of the jitted step.

Legend: R sampled rows, V vocab.

Top-k and top-p never sort the vocabulary. Each row's threshold is the largest value t
whose tokens at or above t still satisfy the filter, found digit by digit over the bits
of an order-preserving unsigned key of t, `_BITS_PER_PASS` bits a pass. A pass tries the
2**bits - 1 candidates of the next digit as sibling reductions over the row: a pass costs
about one read of the logits, not arithmetic. On an H200 (R=256, V=152k, float32) two bits
a pass beat one and four; unrolling the passes saves ~5% but triples CPU compile time.
Top-k searches the raw logits in their own dtype (bf16 logits need half the passes of
float32): dividing by a positive temperature keeps the order. Top-p searches the
unnormalized probabilities, so a pass reads one array.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int, Shaped

from vjx.sampling.metadata import SamplingMetadata

_SAMPLING_EPS = 1e-5
"""Rows with a lower temperature are greedy, as `SamplingParams.is_greedy` decides."""
_BITS_PER_PASS = 2
_KEY_DTYPES = {4: (jnp.uint32, 32), 2: (jnp.uint16, 16)}
"""Float width in bytes -> (unsigned key dtype, key bits)."""


def sample(logits: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, "R"]:
    """Picks one int32 token per row.

    Pipeline, per row:
      1. greedy rows (temperature < 1e-5) take the argmax of the raw logits, exactly;
         with `md.all_greedy` (static) that is the whole program;
      2. the others divide the float32 logits by their temperature,
      3. keep the top-k: every logit >= the k-th largest (ties with it are kept);
         `top_k` 0 or >= V keeps all,
      4. keep the top-p of what top-k left: the most likely tokens down to the largest
         probability whose tokens at or above it hold mass >= p of the renormalized
         distribution (ties with it are kept, at least one token is); `top_p` 1 keeps all,
      5. set the rest to -inf and draw with the Gumbel-max trick under the row's key
         fold_in(key(seed), position), which depends on nothing else in the batch.
    """
    greedy_R = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if md.all_greedy:
        return greedy_R
    is_greedy_R = md.temperature < _SAMPLING_EPS
    # Greedy rows divide by 1 so that they stay finite; their draw is discarded below.
    temperature_R = jnp.where(is_greedy_R, 1.0, md.temperature).astype(jnp.float32)
    scaled_RV = logits.astype(jnp.float32) / temperature_R[:, None]
    is_kept_RV = _top_k_mask(logits, md.top_k)
    is_kept_RV = _top_p_mask(scaled_RV, is_kept_RV, md.top_p)
    filtered_RV = jnp.where(is_kept_RV, scaled_RV, -jnp.inf)
    keys_R = jax.vmap(_row_key)(md.seeds, md.positions)
    sampled_R = jax.vmap(jax.random.categorical)(keys_R, filtered_RV).astype(jnp.int32)
    return jnp.where(is_greedy_R, greedy_R, sampled_R)


def apply_top_k_top_p(
    logits: Float[Array, "R V"], top_k: Int[Array, "R"], top_p: Float[Array, "R"]
) -> Float[Array, "R V"]:
    """The float32 logits with every token that top-k, then top-p, drops set to -inf.

    Steps 3 and 4 of `sample`, for logits already divided by the temperature.
    """
    is_kept_RV = _top_k_mask(logits, top_k)
    is_kept_RV = _top_p_mask(logits.astype(jnp.float32), is_kept_RV, top_p)
    return jnp.where(is_kept_RV, logits.astype(jnp.float32), -jnp.inf)


def _row_key(seed: Int[Array, ""], position: Int[Array, ""]) -> Array:
    return jax.random.fold_in(jax.random.key(seed), position)


def _top_k_mask(logits: Float[Array, "R V"], top_k: Int[Array, "R"]) -> Bool[Array, "R V"]:
    """Keeps every logit >= the k-th largest: the largest t with at least k logits >= t."""
    vocab_size = logits.shape[-1]
    k_R = jnp.where((top_k <= 0) | (top_k >= vocab_size), vocab_size, top_k)

    def is_kept(t_R: Float[Array, "R"]) -> Bool[Array, "R"]:
        return jnp.sum(logits >= t_R[:, None], axis=-1, dtype=jnp.int32) >= k_R

    threshold_R = _largest_kept(jnp.min(logits, axis=-1), is_kept)
    return logits >= threshold_R[:, None]


def _top_p_mask(
    logits: Float[Array, "R V"], is_kept_RV: Bool[Array, "R V"], top_p: Float[Array, "R"]
) -> Bool[Array, "R V"]:
    """Narrows `is_kept` to its smallest most-likely set with probability mass >= p."""
    max_R = jnp.max(logits, axis=-1)
    # A row of -inf has no finite maximum; shifting it by 0 keeps its mass 0 instead of NaN.
    max_R = jnp.where(jnp.isfinite(max_R), max_R, 0.0)
    weight_RV = jnp.where(is_kept_RV, jnp.exp(logits - max_R[:, None]), 0.0)
    target_R = top_p * jnp.sum(weight_RV, axis=-1)

    def is_kept(t_R: Float[Array, "R"]) -> Bool[Array, "R"]:
        mass_R = jnp.sum(jnp.where(weight_RV >= t_R[:, None], weight_RV, 0.0), axis=-1)
        return (mass_R >= target_R) & (mass_R > 0.0)

    threshold_R = _largest_kept(jnp.zeros_like(target_R), is_kept)
    # Summing in float32 can drop tokens too unlikely to move the sum; p = 1 must keep them.
    threshold_R = jnp.where(top_p < 1.0, threshold_R, 0.0)
    return is_kept_RV & (weight_RV >= threshold_R[:, None])


def _largest_kept(
    floor_R: Float[Array, "R"], is_kept: Callable[[Float[Array, "R"]], Bool[Array, "R"]]
) -> Float[Array, "R"]:
    """The largest t >= floor (per row, in floor's dtype) with `is_kept(t)`.

    `is_kept` must hold at `floor` and be monotone: true up to the answer, false above it.
    The key's digits are settled from the most significant; the next digit is the number
    of its nonzero values still kept, since the kept candidates form a prefix. Candidates
    below `floor` are raised to it, where `is_kept` holds, so keys that decode to NaN or
    lie below the row's range are never chosen.
    """
    key_dtype, key_bits = _KEY_DTYPES[floor_R.dtype.itemsize]
    floor_key_R = _to_key(floor_R)

    def settle_digit(i: Int[Array, ""], key_R: Shaped[Array, "R"]) -> Shaped[Array, "R"]:
        shift = (key_bits - (i + 1) * _BITS_PER_PASS).astype(key_dtype)
        digit_R = jnp.zeros_like(key_R)
        for digit in range(1, 2**_BITS_PER_PASS):
            candidate_R = jnp.maximum(key_R | (key_dtype(digit) << shift), floor_key_R)
            digit_R += is_kept(_from_key(candidate_R, floor_R.dtype)).astype(key_dtype)
        return key_R | (digit_R << shift)

    num_passes = key_bits // _BITS_PER_PASS
    key_R = lax.fori_loop(0, num_passes, settle_digit, jnp.zeros_like(floor_key_R))
    return _from_key(jnp.maximum(key_R, floor_key_R), floor_R.dtype)


def _to_key(x: Shaped[Array, "*B"]) -> Shaped[Array, "*B"]:
    """Float -> unsigned key of the same width and order: negatives flip all bits, the
    rest only the sign bit."""
    key_dtype, key_bits = _KEY_DTYPES[x.dtype.itemsize]
    sign = key_dtype(1 << (key_bits - 1))
    bits = lax.bitcast_convert_type(x, key_dtype)
    return jnp.where((bits & sign) != 0, ~bits, bits | sign)


def _from_key(key: Shaped[Array, "*B"], dtype: jnp.dtype) -> Shaped[Array, "*B"]:
    """The inverse of `_to_key`."""
    key_dtype, key_bits = _KEY_DTYPES[key.dtype.itemsize]
    sign = key_dtype(1 << (key_bits - 1))
    bits = jnp.where((key & sign) != 0, key & ~sign, ~key)
    return lax.bitcast_convert_type(bits, dtype)
