"""The sampling metadata of one step: a pytree of per-row device arrays and one static flag.

Legend: R sampled rows (the request bucket `Rs` of the step), V vocab, L token history
length, S stop tokens per row, B bad words per row, W tokens per bad word.

The model runner builds these arrays every step; every field keeps its shape and dtype from
step to step, so only the static flags at the end select a compiled variant. Each logits
processor has a neutral value and, when its flag lets it in, is skipped at run time
(`lax.cond`) when no row uses it.

Padding rows: a row with `num_tokens == 0` has no history, so no penalty or bad word touches
it (nor makes the batch run those processors), whatever its penalties and words hold; with
`has_logit_bias` and `is_below_min_tokens` False nothing else does, and `temperature == 0`
makes it greedy. A row of zeros is therefore a valid padding row. Real rows always have
`num_tokens >= 1` (a request's prompt is never empty).
"""

import dataclasses

import jax
from jaxtyping import Array, Bool, Float, Int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingMetadata:
    # How to draw: neutral values are temperature 1, top_k 0, top_p 1, min_p 0.
    temperature: Float[Array, "R"]
    """float32; a row below 1e-5 (0 in practice) is greedy: the argmax of its processed logits."""
    top_k: Int[Array, "R"]
    """int32; keep the k largest logits (ties at the k-th kept too). 0, or k >= V, is off."""
    top_p: Float[Array, "R"]
    """float32 in (0, 1]; keep the smallest set of most likely tokens with mass >= p. 1 is off."""
    min_p: Float[Array, "R"]
    """float32 in [0, 1]; keep tokens whose probability is >= min_p x the row's largest. 0 is off."""
    seeds: Int[Array, "R"]
    """int32; the row's request seed (its own `SamplingParams.seed`, else one from the engine)."""
    positions: Int[Array, "R"]
    """int32; output tokens the row already has. The row's key is fold_in(key(seed), position),
    so a seeded request draws the same tokens whatever batch or row it lands in."""

    # Penalties: neutral values are presence 0, frequency 0, repetition 1.
    presence_penalty: Float[Array, "R"]
    """float32 in [-2, 2]; subtracted once from every token the OUTPUT holds."""
    frequency_penalty: Float[Array, "R"]
    """float32 in [-2, 2]; subtracted once per occurrence of a token in the OUTPUT."""
    repetition_penalty: Float[Array, "R"]
    """float32 > 0; divides positive (multiplies other) logits of tokens in prompt or output."""

    # The row's tokens so far, read by the penalties and the bad words.
    token_ids: Int[Array, "R L"]
    """int32; prompt then output tokens, left-aligned. Columns >= num_tokens are ignored
    (any value); ids outside [0, V) are ignored too."""
    num_prompt_tokens: Int[Array, "R"]
    """int32; columns [0, num_prompt_tokens) of token_ids are the prompt, the rest output."""
    num_tokens: Int[Array, "R"]
    """int32 <= L; valid columns of token_ids (prompt + output). 0 marks a padding row."""

    # Logit bias and allowed tokens, folded into one dense additive bias per request by the
    # runner, which keeps them in a table of N >= R rows (one per persistent-batch slot): the
    # table is read, row by row, only when some row has a bias.
    logit_bias: Float[Array, "N V"]
    """float32; a request's logit_bias, and -inf for every token outside its
    allowed_token_ids; 0 elsewhere."""
    logit_bias_rows: Int[Array, "R"]
    """int32; the table row of each sampled row (read only where has_logit_bias)."""
    has_logit_bias: Bool[Array, "R"]
    """bool; the row's logit_bias is not all zero. When no row has one the add is skipped."""

    # min_tokens: while a row is below its min_tokens, its stop tokens cannot be drawn.
    stop_token_ids: Int[Array, "R S"]
    """int32; the row's EOS (unless ignore_eos) and stop_token_ids, padded with -1."""
    is_below_min_tokens: Bool[Array, "R"]
    """bool; the row has fewer than min_tokens output tokens: its stop tokens get -inf."""

    # Bad words: each word's token ids, RIGHT-aligned (its last token in column W - 1),
    # left-padded with -1; a word of all -1 is no word.
    bad_words: Int[Array, "R B W"]
    """int32; a word's last token gets -inf when the word's other tokens are the row's last
    OUTPUT tokens (a one-token word is always banned), as vLLM decides."""

    # Static flags, set by the runner from what the batch's requests ask for (each is a
    # compiled variant). A False flag leaves its code out of the program; a True one keeps it
    # behind a run-time check, which on a GPU reads its predicate on the host.
    all_greedy: bool = dataclasses.field(default=False, metadata=dict(static=True))
    """Every row is greedy: the program is an argmax, without the random draw."""
    may_filter: bool = dataclasses.field(default=True, metadata=dict(static=True))
    """Some row may use min-p, top-k or top-p."""
    may_process: bool = dataclasses.field(default=True, metadata=dict(static=True))
    """Some row may use a logits processor (bias, allowed tokens, bad words, min_tokens, penalties)."""
