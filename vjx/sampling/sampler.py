"""The on-device sampler: one token per sampled row, at the end of the jitted step.

Legend: R sampled rows, V vocab.

Min-p, top-k and top-p never sort the vocabulary: vjx/sampling/top_k_top_p.py finds each
row's thresholds by bitwise search, on a small candidate subset of the row where that is
exact. Each filter, and each logits processor, runs only when some row of the batch uses it
(`lax.cond`), so a feature no request asks for costs nothing but its predicate.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from vjx.sampling.bad_words import apply_bad_words, has_bad_words
from vjx.sampling.grammar_bitmask import apply_grammar_bans, has_grammar_bans
from vjx.sampling.logit_bias import apply_logit_bias, has_logit_bias
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling.min_tokens import apply_min_tokens, has_min_tokens
from vjx.sampling.penalties import apply_penalties, has_penalties
from vjx.sampling.top_k_top_p import FilterParams, filter_mask, filter_thresholds

_SAMPLING_EPS = 1e-5
"""Rows with a lower temperature are greedy, as `SamplingParams.is_greedy` decides."""
_LOGITS_PROCESSORS = (
    (has_grammar_bans, apply_grammar_bans),
    (has_logit_bias, apply_logit_bias),
    (has_bad_words, apply_bad_words),
    (has_min_tokens, apply_min_tokens),
    (has_penalties, apply_penalties),
)
"""(is used by some row, apply) in vLLM's order (the grammar's mask first): the processors
that can change the argmax."""


def sample(logits: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, " R"]:
    """Picks one int32 token per row.

    Pipeline, per row, in vLLM's order (each step a no-op for rows that do not use it):
      a. the grammar's mask (structured outputs: tokens it does not allow get -inf), logit
         bias and allowed tokens (one dense add), bad words, min_tokens masking
         (EOS and stop tokens get -inf while the row is below min_tokens);
      b. penalties on the float32 logits: repetition (tokens of prompt or output), then
         frequency and presence (tokens of the output);
      c. greedy rows (temperature < 1e-5) take the argmax of THESE processed logits,
         exactly; with `md.all_greedy` (static) that ends the program, and on the CPU a
         batch whose real rows are all greedy ends there at run time (with `may_filter`);
      d. the others divide the processed logits by their temperature,
      e. keep the tokens that min-p keeps (probability >= min_p x the largest), top-k keeps
         (every logit >= the k-th largest, ties kept; `top_k` 0 or >= V keeps all), and
         then top-p keeps from what is left (the most likely tokens down to the largest
         probability whose tokens at or above it hold mass >= p of the renormalized
         distribution, ties kept, at least one token; `top_p` 1 keeps all),
      f. set the rest to -inf and draw with the Gumbel-max trick under the row's key
         fold_in(key(seed), position), which depends on nothing else in the batch.
    Steps a-b and e are left out of the program when `md.may_process` / `md.may_filter`
    (static) say no row uses them; a greedy batch without processors is a bare argmax.
    """
    if md.all_greedy:
        return _greedy(logits, md)
    processed_RV = apply_logits_processors(logits, md)
    is_greedy_R = md.temperature < _SAMPLING_EPS
    greedy_R = _argmax(processed_RV)

    def with_draws():
        return jnp.where(is_greedy_R, greedy_R, _draw(processed_RV, md))

    if jax.default_backend() != "cpu" or not md.may_filter:
        return with_draws()
    # On the CPU the draw's Gumbel noise over [R, V] costs more than the rest of a small
    # model's step (SmolLM2, 64 rows: ~50 ms); a conditional costs nothing there (on a GPU it
    # would read its predicate on the host), so a batch of greedy rows skips it. A program
    # without run-time checks (`may_filter` False, the PLAIN variant) gets none.
    has_draws = jnp.any(~is_greedy_R & (md.num_tokens > 0))
    return lax.cond(has_draws, with_draws, lambda: greedy_R)


def apply_logits_processors(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    """Steps a and b of `sample`: the float32 logits that greedy rows take the argmax of."""
    logits = logits.astype(jnp.float32)
    if not md.may_process:
        return logits
    for is_used, apply in _LOGITS_PROCESSORS:
        logits = lax.cond(is_used(md), apply, _unchanged, logits, md)
    return logits


def _unchanged(logits: Float[Array, "R V"], md: SamplingMetadata) -> Float[Array, "R V"]:
    return logits


def _argmax(logits: Float[Array, "R V"]) -> Int[Array, " R"]:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _greedy(logits: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, " R"]:
    """Every row greedy. Without a processor in use the raw logits are read once and never
    copied (a processor's `lax.cond` must copy logits that the caller still reads)."""
    if not md.may_process:
        return _argmax(logits)
    is_processed = jnp.any(jnp.stack([is_used(md) for is_used, _ in _LOGITS_PROCESSORS]))
    return lax.cond(is_processed, lambda: _argmax(apply_logits_processors(logits, md)), lambda: _argmax(logits))


def _draw(processed: Float[Array, "R V"], md: SamplingMetadata) -> Int[Array, " R"]:
    """Steps d to f of `sample`; greedy rows draw too (at temperature 1), to be discarded."""
    # Greedy rows divide by 1 so that they stay finite.
    temperature_R = jnp.where(md.temperature < _SAMPLING_EPS, 1.0, md.temperature).astype(jnp.float32)
    if md.may_filter:
        # Materialized once: the top-p threshold is one of its elements, compared bit for bit.
        scaled_RV = lax.optimization_barrier(processed / temperature_R[:, None])
        params = FilterParams(temperature_R, md.min_p, md.top_k, md.top_p)
        is_kept_RV = filter_mask(processed, scaled_RV, filter_thresholds(processed, scaled_RV, params))
        filtered_RV = jnp.where(is_kept_RV, scaled_RV, -jnp.inf)
    else:
        filtered_RV = processed / temperature_R[:, None]
    keys_R = jax.vmap(_row_key)(md.seeds, md.sample_positions)
    return jax.vmap(jax.random.categorical)(keys_R, filtered_RV).astype(jnp.int32)


def _row_key(seed: Int[Array, ""], position: Int[Array, ""]) -> Array:
    return jax.random.fold_in(jax.random.key(seed), position)
