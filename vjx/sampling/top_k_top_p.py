"""Min-p, top-k and top-p: each row's two thresholds, found without sorting the vocabulary.

Legend: R sampled rows, V vocab, X tokens searched per row (V, or a row's candidate subset),
C chunks of the vocab.

A row keeps the tokens whose processed logit is >= `FilterThresholds.logit` (min-p and top-k)
and whose scaled logit (over the temperature) is >= `FilterThresholds.scaled` (top-p).

Searches. A threshold is the largest t whose tokens at or above t still satisfy the filter,
found digit by digit over the bits of an order-preserving unsigned key of t,
`_BITS_PER_PASS` bits a pass: a pass tries the 2**bits - 1 candidates of the next digit as
sibling reductions over the row, about one read of the row. On an H200 (R=256, V=128k,
float32) two bits a pass beat one and four; 16 passes over a full row cost ~1.1 ms.

Candidate subsets. The vocab is cut into chunks of `SubsetShape.chunk_size` tokens; the
`num_chunks` chunks with the largest maxima form a row's subset (X = num_chunks x chunk_size,
gathered once), and every search runs on the subset. Every token above the boundary (the
largest maximum of a chunk left out) is in the subset, so counts and masses above it are the
row's own: a threshold found on the subset is exact when it lies above the boundary (top-k
with k <= num_chunks always does, ties aside), and a row whose thresholds do not falls back
to the full-vocab search. Which path a row takes depends on its own logits and parameters
only, so a seeded row draws the same whatever batch it is in. The top-p target (p times the
mass the earlier filters keep) is always summed over the whole row.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int, Shaped

_BITS_PER_PASS = 2
_KEY_DTYPES = {4: (jnp.uint32, 32), 2: (jnp.uint16, 16)}
"""Float width in bytes -> (unsigned key dtype, key bits)."""


@dataclasses.dataclass(frozen=True)
class SubsetShape:
    """How a row's candidate subset is cut: `num_chunks` chunks of `chunk_size` tokens."""

    chunk_size: int = 128
    num_chunks: int = 128

    def fits(self, vocab_size: int) -> bool:
        """Whether the subset pays off: the vocab splits into chunks and is 4x the subset."""
        return vocab_size % self.chunk_size == 0 and vocab_size >= 4 * self.chunk_size * self.num_chunks


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FilterParams:
    temperature: Float[Array, " R"]
    """Positive: greedy rows draw at 1, to be discarded."""
    min_p: Float[Array, " R"]
    top_k: Int[Array, " R"]
    top_p: Float[Array, " R"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FilterThresholds:
    logit: Float[Array, " R"]
    """Keep processed logits >= this (min-p and top-k); -inf keeps all."""
    scaled: Float[Array, " R"]
    """Keep scaled logits >= this (top-p); -inf keeps all."""


def filter_thresholds(
    processed: Float[Array, "R V"],
    scaled: Float[Array, "R V"],
    params: FilterParams,
    subset: SubsetShape = SubsetShape(),
) -> FilterThresholds:
    """The thresholds of min-p, then top-k, then top-p (on what the first two keep).

    `scaled` must be `processed / temperature` as one materialized array: the thresholds are
    values of its elements, compared with them bit for bit.
    """
    vocab_size = processed.shape[-1]
    is_searched_R = (params.top_k > 0) & (params.top_k < vocab_size) | (params.top_p < 1.0)

    def searched() -> FilterThresholds:
        if not subset.fits(vocab_size):
            return _thresholds(processed, scaled, processed, scaled, params)[0]
        on_subset, is_exact_R = _subset_thresholds(processed, scaled, params, subset)
        full = lax.cond(
            jnp.all(is_exact_R),
            lambda: on_subset,
            lambda: _thresholds(processed, scaled, processed, scaled, params)[0],
        )
        return jax.tree.map(lambda s, f: jnp.where(is_exact_R, s, f), on_subset, full)

    def min_p_only() -> FilterThresholds:
        min_p_R = _min_p_threshold(processed, params)
        return FilterThresholds(min_p_R, jnp.full_like(min_p_R, -jnp.inf))

    return lax.cond(jnp.any(is_searched_R), searched, min_p_only)


def filter_mask(
    processed: Float[Array, "R V"], scaled: Float[Array, "R V"], thresholds: FilterThresholds
) -> Bool[Array, "R V"]:
    return (processed >= thresholds.logit[:, None]) & (scaled >= thresholds.scaled[:, None])


def _subset_thresholds(
    processed: Float[Array, "R V"], scaled: Float[Array, "R V"], params: FilterParams, subset: SubsetShape
) -> tuple[FilterThresholds, Bool[Array, " R"]]:
    """The thresholds found on each row's subset, and whether each row's are exact."""
    num_rows, vocab_size = processed.shape
    shape_RCS = (num_rows, vocab_size // subset.chunk_size, subset.chunk_size)
    chunk_max_RC = jnp.max(processed.reshape(shape_RCS), axis=-1)
    # One chunk more than the subset: the largest chunk left out holds the boundary.
    _, chunk_ids_RC = lax.top_k(chunk_max_RC, subset.num_chunks + 1)

    def gather(x_RV: Float[Array, "R V"]) -> Float[Array, "R C S"]:
        return jnp.take_along_axis(x_RV.reshape(shape_RCS), chunk_ids_RC[:, :, None], axis=1)

    processed_RCS, scaled_RCS = gather(processed), gather(scaled)
    boundary_logit_R = jnp.max(processed_RCS[:, -1], axis=-1)
    boundary_scaled_R = jnp.max(scaled_RCS[:, -1], axis=-1)
    flat = (num_rows, subset.num_chunks * subset.chunk_size)
    thresholds, top_k_R = _thresholds(
        processed_RCS[:, :-1].reshape(flat), scaled_RCS[:, :-1].reshape(flat), processed, scaled, params
    )
    is_top_k_exact_R = (params.top_k <= 0) | (params.top_k >= vocab_size) | (top_k_R > boundary_logit_R)
    # Tokens below the boundary never reach the top-p search: exact only if top-p keeps none.
    is_top_p_exact_R = (
        (params.top_p >= 1.0) | (thresholds.scaled > boundary_scaled_R) | (thresholds.logit > boundary_logit_R)
    )
    return thresholds, is_top_k_exact_R & is_top_p_exact_R


def _thresholds(
    processed_RX: Float[Array, "R X"],
    scaled_RX: Float[Array, "R X"],
    processed_RV: Float[Array, "R V"],
    scaled_RV: Float[Array, "R V"],
    params: FilterParams,
) -> tuple[FilterThresholds, Float[Array, " R"]]:
    """The thresholds searched on the candidates `*_RX` (every row's largest logits), with the
    top-p target summed over the whole rows `*_RV`; also the top-k threshold alone."""
    vocab_size = processed_RV.shape[-1]
    min_p_R = _min_p_threshold(processed_RX, params)
    is_top_k_R = (params.top_k > 0) & (params.top_k < vocab_size)
    top_k_R = lax.cond(
        jnp.any(is_top_k_R),
        lambda: jnp.where(is_top_k_R, _top_k_threshold(processed_RX, params.top_k), -jnp.inf),
        lambda: jnp.full_like(min_p_R, -jnp.inf),
    )
    logit_R = jnp.maximum(min_p_R, top_k_R)
    # Rows of -inf get weights exp(x - 0) = 0 rather than NaN.
    max_scaled_R = jnp.max(scaled_RX, axis=-1)
    max_scaled_R = jnp.where(jnp.isfinite(max_scaled_R), max_scaled_R, 0.0)

    def weights(processed: Float[Array, "R Y"], scaled: Float[Array, "R Y"]) -> Float[Array, "R Y"]:
        is_kept = processed >= logit_R[:, None]
        return jnp.where(is_kept, jnp.exp(scaled - max_scaled_R[:, None]), 0.0)

    def top_p_threshold() -> Float[Array, " R"]:
        target_R = params.top_p * jnp.sum(weights(processed_RV, scaled_RV), axis=-1)
        return _top_p_threshold(weights(processed_RX, scaled_RX), scaled_RX, target_R)

    is_top_p_R = params.top_p < 1.0
    scaled_threshold_R = lax.cond(jnp.any(is_top_p_R), top_p_threshold, lambda: jnp.full_like(min_p_R, -jnp.inf))
    scaled_threshold_R = jnp.where(is_top_p_R, scaled_threshold_R, -jnp.inf)
    return FilterThresholds(logit_R, scaled_threshold_R), top_k_R


def _min_p_threshold(processed: Float[Array, "R X"], params: FilterParams) -> Float[Array, " R"]:
    """Keeps tokens with probability >= min_p x the largest, at the row's temperature.

    exp((x - max) / t) >= min_p, compared as x >= max + t log(min_p) on the logits before
    the temperature: no exp, and the largest token is kept exactly even at min_p = 1.
    min_p = 0 gives -inf, which keeps every token.
    """
    return jnp.max(processed, axis=-1) + params.temperature * jnp.log(params.min_p)


def _top_k_threshold(logits: Float[Array, "R X"], top_k: Int[Array, " R"]) -> Float[Array, " R"]:
    """The largest t with at least k logits >= t: the k-th largest logit."""

    def is_kept(t_R: Float[Array, " R"]) -> Bool[Array, " R"]:
        return jnp.sum(logits >= t_R[:, None], axis=-1, dtype=jnp.int32) >= top_k

    return _largest_kept(jnp.min(logits, axis=-1), is_kept)


def _top_p_threshold(
    weight_RX: Float[Array, "R X"], scaled_RX: Float[Array, "R X"], target_R: Float[Array, " R"]
) -> Float[Array, " R"]:
    """The smallest scaled logit among the most likely tokens whose weights hold >= target.

    The search finds the weight w of that token; the mask compares scaled logits, whose order
    the weights follow, so the threshold is the smallest scaled logit of weight >= w.
    """

    def is_kept(t_R: Float[Array, " R"]) -> Bool[Array, " R"]:
        mass_R = jnp.sum(jnp.where(weight_RX >= t_R[:, None], weight_RX, 0.0), axis=-1)
        return (mass_R >= target_R) & (mass_R > 0.0)

    weight_R = _largest_kept(jnp.zeros_like(target_R), is_kept)
    is_kept_RX = (weight_RX >= weight_R[:, None]) & (weight_RX > 0.0)
    return jnp.min(jnp.where(is_kept_RX, scaled_RX, jnp.inf), axis=-1)


def _largest_kept(
    floor_R: Float[Array, " R"], is_kept: Callable[[Float[Array, " R"]], Bool[Array, " R"]]
) -> Float[Array, " R"]:
    """The largest t >= floor (per row, in floor's dtype) with `is_kept(t)`.

    `is_kept` must hold at `floor` and be monotone: true up to the answer, false above it.
    The key's digits are settled from the most significant; the next digit is the number
    of its nonzero values still kept, since the kept candidates form a prefix. Candidates
    below `floor` are raised to it, where `is_kept` holds, so keys that decode to NaN or
    lie below the row's range are never chosen.
    """
    key_dtype, key_bits = _KEY_DTYPES[floor_R.dtype.itemsize]
    floor_key_R = _to_key(floor_R)

    def settle_digit(i: Int[Array, ""], key_R: Shaped[Array, " R"]) -> Shaped[Array, " R"]:
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
