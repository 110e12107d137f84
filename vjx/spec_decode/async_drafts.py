"""Speculative decoding with async scheduling: a step is packed before the one in flight has
told the host how many of its drafts were accepted.

The scheduler counts every draft in flight as accepted (vLLM's optimistic accounting), so a
row's positions are packed too far by the drafts its previous step rejected. That count is in
the previous step's sampled array (after the drawn tokens), on the device, and the step takes
that array back as `prev_sampled`: it shifts the row's positions, sequence length, slots,
output position and history length back by it before anything reads them. The row's tokens
come from that array too: its first is the previous step's token drawn after the last
accepted draft (a sampled index below `max_num_samples`, packed as if every draft were
accepted, shifted the same way), the others the drafts proposed after that step (their
indices past the rejected counts; see `draft_index`).

Legend: T tokens, R rows, S sampling positions, G KV cache groups, MS the sampled array.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from vjx.worker.step_inputs import Per, Source, StepInput

ASYNC_SPEC_INPUTS = (
    StepInput(
        "prev_row_index",
        np.int32,
        Per.ROW,
        Source.STEP,
        "The row's index in the previous step when that step had drafts for it, whose rejected "
        "count shifts the row back (-1: the row's counts are exact).",
        padding=-1,
    ),
    StepInput(
        "next_prompt_token",
        np.int32,
        Per.ROW,
        Source.STEP,
        "The prompt token after the row's tokens when the step does not reach its prompt's end "
        "(the drafter pairs it with the row's last token); -1: the row samples.",
        padding=-1,
    ),
)


def draft_index(layout, prev_row: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Where draft j proposed for the previous step's row `prev_row` is in the sampled array."""
    return layout.max_num_samples + layout.max_num_reqs + prev_row * layout.num_spec_tokens + j


def correct_optimistic_fields(layout, f: dict[str, Array], prev_sampled: Int[Array, " MS"]) -> dict[str, Array]:
    """`f` with every field that counts a row's tokens shifted back by the drafts its
    previous step rejected (unchanged for rows with `prev_row_index` -1)."""
    prev_row = f["prev_row_index"]
    shift = jnp.where(prev_row >= 0, prev_sampled[layout.max_num_samples + jnp.maximum(prev_row, 0)], 0)
    token_row = jnp.searchsorted(f["query_start_loc"], jnp.arange(layout.num_tokens), side="right") - 1
    token_shift = shift[jnp.clip(token_row, 0, layout.num_reqs - 1)]
    token_shift = jnp.where(jnp.arange(layout.num_tokens) < f["query_start_loc"][-1], token_shift, 0)
    positions = f["positions"] - token_shift
    prev_index = f["prev_sampled_index"]
    is_bonus = (prev_index >= 0) & (prev_index < layout.max_num_samples)
    block_size = layout.block_size
    rows = jnp.clip(token_row, 0, layout.num_reqs - 1)
    blocks = f["block_tables"][:, rows, positions // block_size]
    slots = jnp.where(token_shift > 0, blocks * block_size + positions % block_size, f["slot_mapping"])
    return {
        **f,
        "positions": positions,
        "slot_mapping": slots,
        "prev_sampled_index": jnp.where(is_bonus, prev_index - token_shift, prev_index),
        "seq_lens": f["seq_lens"] - shift,
        "sample_positions": f["sample_positions"] - shift,
        "spec_num_tokens": jnp.where(f["spec_num_tokens"] > 0, f["spec_num_tokens"] - shift[f["spec_sample_rows"]], 0),
    }


def with_drafts(layout, sampled: Int[Array, " MS"], drafts: Int[Array, "R K"]) -> Int[Array, " MS"]:
    """The sampled array with the drafts proposed after its step in their place."""
    start = layout.max_num_samples + layout.max_num_reqs
    return sampled.at[start : start + drafts.size].set(drafts.reshape(-1))


def drafting_inputs(
    layout, f: dict[str, Array], input_ids: Int[Array, " T"], sampled: Int[Array, " MS"]
) -> tuple[Int[Array, " T"], Int[Array, " R"]]:
    """For a drafter run right after a step (`f` its corrected fields, `sampled` its output),
    without the host: per token, the token after it (the next input of its row, and after the
    row's last kept token the token drawn there, or a prompt row's next prompt token); per row,
    the index of its last kept token (its last token, before the drafts it rejected). Tokens
    past a row's last kept one get its next inputs: their KV is overwritten before it is read."""
    rows, is_real = f["spec_sample_rows"], f["spec_num_tokens"] > 0
    counts = jax.ops.segment_sum(is_real.astype(jnp.int32), rows, layout.num_reqs)
    first_sample = jnp.cumsum(counts) - counts
    rejected = sampled[layout.max_num_samples : layout.max_num_samples + layout.num_reqs]
    is_sampling = f["next_prompt_token"] < 0
    bonus = sampled[first_sample + jnp.maximum(counts - 1 - rejected, 0)]
    is_row = jnp.arange(layout.num_reqs) < f["num_seqs"][0]
    last = f["query_start_loc"][1:] - 1 - jnp.where(is_sampling, rejected, 0)
    after = jnp.concatenate([input_ids[1:], jnp.zeros((1,), jnp.int32)])
    after = after.at[jnp.where(is_row, last, layout.num_tokens)].set(
        jnp.where(is_sampling, bonus, f["next_prompt_token"]), mode="drop"
    )
    return after, jnp.where(is_row, last, 0)
