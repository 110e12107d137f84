"""The sampling metadata of one step: per-row device arrays and static flags.

Legend: R sampled rows (the request bucket `Rs` of the step), V vocab, L token history
length, K stop tokens per row, B bad words per row, W tokens per bad word, M = ceil(V / 32)
grammar mask words.

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

from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingMetadata:
    """The fields the step computes on the device. The step input table
    (vjx/worker/step_inputs.py) adds one field per input it routes here, in a subclass that
    is the pytree: how to draw (`temperature`, `top_k`, `top_p`, `min_p`, `seeds`,
    `sample_positions`), the penalties (`presence_penalty`, `frequency_penalty`,
    `repetition_penalty`), `num_prompt_tokens`, `has_logit_bias`, `stop_token_ids` and
    `is_below_min_tokens`, each documented there. Neutral values: temperature 1, top_k 0,
    top_p 1, min_p 0; presence 0, frequency 0, repetition 1.

    A row's key is fold_in(key(seed), sample_positions), so a seeded request draws the same
    tokens whatever batch or row it lands in. Penalties: presence and frequency count the
    OUTPUT's tokens, repetition those of prompt and output. min_tokens: while a row is below
    its min_tokens, its stop tokens (`stop_token_ids`, -1 padded) cannot be drawn.
    """

    # The row's tokens so far, read by the penalties and the bad words.
    token_ids: Int[Array, "R L"]
    """int32; prompt then output tokens, left-aligned. Columns >= num_tokens are ignored
    (any value); ids outside [0, V) are ignored too."""
    num_tokens: Int[Array, " R"]
    """int32 <= L; valid columns of token_ids (prompt + output). 0 marks a padding row."""

    # Logit bias and allowed tokens, folded into one dense additive bias per request by the
    # runner, which keeps them in a table of N >= R rows (one per persistent-batch slot): the
    # table is read, row by row, only when some row has a bias.
    logit_bias: Float[Array, "N V"]
    """float32; a request's logit_bias, and -inf for every token outside its
    allowed_token_ids; 0 elsewhere."""
    logit_bias_rows: Int[Array, " R"]
    """int32; the table row of each sampled row (read only where has_logit_bias)."""

    # Bad words: each word's token ids, RIGHT-aligned (its last token in column W - 1),
    # left-padded with -1; a word of all -1 is no word.
    bad_words: Int[Array, "R B W"]
    """int32; a word's last token gets -inf when the word's other tokens are the row's last
    OUTPUT tokens (a one-token word is always banned), as vLLM decides."""

    grammar_bans: Int[Array, "R M"]
    """int32 [R, ceil(V / 32)]; bit v % 32 of word v // 32 set: the row's grammar does not
    allow token v (structured outputs); a row without a grammar is all zeros."""

    # Static flags, set by the runner from what the batch's requests ask for (each is a
    # compiled variant). A False flag leaves its code out of the program; a True one keeps it
    # behind a run-time check, which on a GPU reads its predicate on the host.
    all_greedy: bool = dataclasses.field(default=False, metadata=dict(static=True))
    """Every row is greedy: the program is an argmax, without the random draw."""
    may_filter: bool = dataclasses.field(default=True, metadata=dict(static=True))
    """Some row may use min-p, top-k or top-p."""
    may_process: bool = dataclasses.field(default=True, metadata=dict(static=True))
    """Some row may use a logits processor (bias, allowed tokens, bad words, min_tokens, penalties)."""
