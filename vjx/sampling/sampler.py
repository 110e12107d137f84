"""The on-device sampler: one token per sampled row, at the end of the jitted step.

Legend: R sampled rows, V vocab.

Top-k and top-p never sort the vocabulary. Each row's threshold is the largest value t
whose tokens at or above t still satisfy the filter, found digit by digit over the bits
of an order-preserving unsigned key of t, `_BITS_PER_PASS` bits a pass. A pass tries the
2**bits - 1 candidates of the next digit as sibling reductions over the row: a pass costs
about one read of the logits, not arithmetic. On an H200 (R=256, V=152k, float32) two bits
a pass beat one and four; unrolling the passes saves ~5% but triples CPU compile time.
Top-k searches the logits before the temperature (dividing by a positive temperature keeps
the order; bf16 logits given to `apply_top_k_top_p` need half the passes of float32).
Top-p searches the unnormalized probabilities, so a pass reads one array. Each search, and
each logits processor, runs only when some row of the batch uses it (`lax.cond`), so a
feature no request asks for costs nothing but its predicate.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int, Shaped

from vjx.sampling.bad_words import apply_bad_words, has_bad_words
from vjx.sampling.logit_bias import apply_logit_bias, has_logit_bias
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling.min_tokens import apply_min_tokens, has_min_tokens
from vjx.sampling.penalties import apply_penalties, has_penalties

_SAMPLING_EPS = 1e-5
"""Rows with a lower temperature are greedy, as `SamplingParams.is_greedy` decides."""
_BITS_PER_PASS = 2
_KEY_DTYPES = {4: (jnp.uint32, 32), 2: (jnp.uint16, 16)}
"""Float width in bytes -> (unsigned key dtype, key bits)."""
_LOGITS_PROCESSORS = (
    (has_logit_bias, apply_logit_bias),
    (has_bad_words, apply_bad_words),
    (has_min_tokens, apply_min_tokens),
    (has_penalties, apply_penalties),
)
"""(is used by some row, apply) in vLLM's order: the processors that can change the argmax."""


def sample(logits: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, "R"]:
    """Picks one int32 token per row.

    Pipeline, per row, in vLLM's order (each step a no-op for rows that do not use it):
      a. logit bias and allowed tokens (one dense add), bad words, min_tokens masking
         (EOS and stop tokens get -inf while the row is below min_tokens);
      b. penalties on the float32 logits: repetition (tokens of prompt or output), then
         frequency and presence (tokens of the output);
      c. greedy rows (temperature < 1e-5) take the argmax of THESE processed logits,
         exactly; with `md.all_greedy` (static) that ends the program, and when every row
         is greedy at run time the steps below are skipped;
      d. the others divide the processed logits by their temperature,
      e. keep the tokens that min-p keeps (probability >= min_p x the largest), top-k keeps
         (every logit >= the k-th largest, ties kept; `top_k` 0 or >= V keeps all), and
         then top-p keeps from what is left (the most likely tokens down to the largest
         probability whose tokens at or above it hold mass >= p of the renormalized
         distribution, ties kept, at least one token; `top_p` 1 keeps all),
      f. set the rest to -inf and draw with the Gumbel-max trick under the row's key
         fold_in(key(seed), position), which depends on nothing else in the batch.
    A greedy batch that no processor touches is a bare argmax of `logits`.
    """
    if md.all_greedy:
        return _greedy(logits, md)
    return lax.cond(jnp.all(md.temperature < _SAMPLING_EPS), _greedy, _sample_some_rows, logits, md)


def apply_logits_processors(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    """Steps a and b of `sample`: the float32 logits that greedy rows take the argmax of."""
    logits = logits.astype(jnp.float32)
    for is_used, apply in _LOGITS_PROCESSORS:
        logits = lax.cond(is_used(md), apply, _unchanged, logits, md)
    return logits


def apply_top_k_top_p(
    logits: Float[Array, "R V"], top_k: Int[Array, "R"], top_p: Float[Array, "R"]
) -> Float[Array, "R V"]:
    """The float32 logits with every token that top-k, then top-p, drops set to -inf.

    The top-k and top-p of step e of `sample`, for logits already divided by the temperature.
    """
    is_kept_RV = _top_k_mask(logits, top_k)
    is_kept_RV = _top_p_mask(logits.astype(jnp.float32), is_kept_RV, top_p)
    return jnp.where(is_kept_RV, logits.astype(jnp.float32), -jnp.inf)


def _unchanged(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    return logits


def _argmax(logits: Float[Array, "R V"]) -> Int[Array, "R"]:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _greedy(logits: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, "R"]:
    """Every row greedy. Without a processor in use the raw logits are read once and never
    copied (a processor's `lax.cond` must copy logits that the caller still reads)."""
    is_processed = jnp.any(jnp.stack([is_used(md) for is_used, _ in _LOGITS_PROCESSORS]))
    return lax.cond(
        is_processed, lambda: _argmax(apply_logits_processors(logits, md)), lambda: _argmax(logits)
    )


def _sample_some_rows(logits: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, "R"]:
    processed_RV = apply_logits_processors(logits, md)
    is_greedy_R = md.temperature < _SAMPLING_EPS
    return jnp.where(is_greedy_R, _argmax(processed_RV), _draw(processed_RV, md))


def _draw(processed: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, "R"]:
    """Steps d to f of `sample`; greedy rows draw too (at temperature 1), to be discarded."""
    # Greedy rows divide by 1 so that they stay finite.
    temperature_R = jnp.where(md.temperature < _SAMPLING_EPS, 1.0, md.temperature).astype(jnp.float32)
    scaled_RV = processed / temperature_R[:, None]
    is_kept_RV = _min_p_mask(processed, temperature_R, md.min_p) & _top_k_mask(processed, md.top_k)
    is_kept_RV = _top_p_mask(scaled_RV, is_kept_RV, md.top_p)
    filtered_RV = jnp.where(is_kept_RV, scaled_RV, -jnp.inf)
    keys_R = jax.vmap(_row_key)(md.seeds, md.positions)
    return jax.vmap(jax.random.categorical)(keys_R, filtered_RV).astype(jnp.int32)


def _row_key(seed: Int[Array, ""], position: Int[Array, ""]) -> Array:
    return jax.random.fold_in(jax.random.key(seed), position)


def _finite_max(logits: Float[Array, "R V"]) -> Float[Array, "R"]:
    """The row maximum; 0 for a row of -inf, whose weights exp(x - max) are then 0, not NaN."""
    max_R = jnp.max(logits, axis=-1)
    return jnp.where(jnp.isfinite(max_R), max_R, 0.0)


def _min_p_mask(
    logits: Float[Array, "R V"], temperature: Float[Array, "R"], min_p: Float[Array, "R"]
) -> Bool[Array, "R V"]:
    """Keeps tokens with probability >= min_p x the largest, at the row's temperature.

    exp((x - max) / t) >= min_p, compared as x >= max + t log(min_p) on the logits before
    the temperature: no exp, and the largest token is kept exactly even at min_p = 1 (XLA
    may round x / t differently where it fuses the division into another loop). min_p = 0
    gives -inf, which keeps every token.
    """
    threshold_R = jnp.max(logits, axis=-1) + temperature * jnp.log(min_p)
    return logits >= threshold_R[:, None]


def _top_k_mask(logits: Float[Array, "R V"], top_k: Int[Array, "R"]) -> Bool[Array, "R V"]:
    """Keeps every logit >= the k-th largest: the largest t with at least k logits >= t."""
    vocab_size = logits.shape[-1]
    k_R = jnp.where((top_k <= 0) | (top_k >= vocab_size), vocab_size, top_k)

    def is_kept(t_R: Float[Array, "R"]) -> Bool[Array, "R"]:
        return jnp.sum(logits >= t_R[:, None], axis=-1, dtype=jnp.int32) >= k_R

    min_R = jnp.min(logits, axis=-1)
    # The row minimum keeps every token; search only when some row keeps fewer.
    threshold_R = lax.cond(
        jnp.any(k_R < vocab_size), lambda: _largest_kept(min_R, is_kept), lambda: min_R
    )
    return logits >= threshold_R[:, None]


def _top_p_mask(
    logits: Float[Array, "R V"], is_kept_RV: Bool[Array, "R V"], top_p: Float[Array, "R"]
) -> Bool[Array, "R V"]:
    """Narrows `is_kept` to its smallest most-likely set with probability mass >= p."""
    weight_RV = jnp.where(is_kept_RV, jnp.exp(logits - _finite_max(logits)[:, None]), 0.0)
    target_R = top_p * jnp.sum(weight_RV, axis=-1)

    def is_kept(t_R: Float[Array, "R"]) -> Bool[Array, "R"]:
        mass_R = jnp.sum(jnp.where(weight_RV >= t_R[:, None], weight_RV, 0.0), axis=-1)
        return (mass_R >= target_R) & (mass_R > 0.0)

    zeros_R = jnp.zeros_like(target_R)
    threshold_R = lax.cond(
        jnp.any(top_p < 1.0), lambda: _largest_kept(zeros_R, is_kept), lambda: zeros_R
    )
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
