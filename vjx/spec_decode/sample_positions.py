"""Speculative decoding inside the step: a row samples after each of its tokens that a
draft follows, so one step verifies every draft.

A decoding row with k drafts runs 1 + k tokens: its last token, then the drafts. Its
sampling position j (0 to k) takes the logits after its j-th token, which draw the token at
output position `sample_positions + j` from the history up to there (`spec_num_tokens`):
exactly the distribution, penalties included, that a step without drafts would draw it from
once the drafts before it were accepted, under the same key fold_in(key(seed), position).
The runner keeps the drafts up to the first that differs from the token drawn at its
position, then that drawn token: for drafts that are one token each (the n-gram proposer's),
accepting draft d with probability p(d) and otherwise drawing from p without d is the
standard rejection rule, so the output is distributed (and, for a seeded request, drawn)
exactly as without speculation.

Legend: S sampling positions (every position of every row, then padding: `min(T, R x (k+1))`),
R rows.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from vjx.sampling.metadata import SamplingMetadata
from vjx.spec_decode.async_drafts import ASYNC_SPEC_INPUTS
from vjx.worker.step_inputs import Per, Source, StepInput
from vjx.worker.step_outputs import StepRecord

SPEC_DECODE_INPUTS = (
    *ASYNC_SPEC_INPUTS,
    StepInput("spec_sample_rows", np.int32, Per.SAMPLE, Source.STEP, "The row each sampling position belongs to."),
    StepInput(
        "spec_sample_offsets", np.int32, Per.SAMPLE, Source.STEP, "j: the position follows the row's j-th token."
    ),
    StepInput("spec_logits_indices", np.int32, Per.SAMPLE, Source.STEP, "The token whose logits it samples from."),
    StepInput(
        "spec_num_tokens",
        np.int32,
        Per.SAMPLE,
        Source.STEP,
        "Tokens of the row's history it sees (the row's tokens up to its own); 0: a padding position.",
    ),
)


def _is_per_row(field: dataclasses.Field) -> bool:
    """Fields with a leading row axis: all but the static flags, the slot-indexed bias table
    and the grammar bans (which come per position)."""
    return not field.metadata.get("static") and field.name not in ("logit_bias", "grammar_bans")


def sample_positions_metadata(md: SamplingMetadata, fields: dict[str, Array], grammar_bans: Array) -> SamplingMetadata:
    """The rows' sampling metadata, one entry per sampling position; `grammar_bans` [S, M]
    is the grammar's mask at each position (after the drafts before it)."""
    rows = fields["spec_sample_rows"]
    per_position = {f.name: getattr(md, f.name)[rows] for f in dataclasses.fields(md) if _is_per_row(f)}
    per_position["grammar_bans"] = grammar_bans
    per_position["num_tokens"] = fields["spec_num_tokens"]
    per_position["sample_positions"] = per_position["sample_positions"] + fields["spec_sample_offsets"]
    return dataclasses.replace(md, **per_position)


def num_rejected_drafts(layout, fields: dict[str, Array], sampled: Int[Array, " S"], input_ids: Int[Array, " T"]):
    """Per row (padded to max_num_reqs), its drafts after the first that differs from the
    token drawn at its position: the drafts the step computed that are not the request's
    tokens. A row's draft j is the input token after the one sampling position j reads."""
    rows, offsets = fields["spec_sample_rows"], fields["spec_sample_offsets"]
    is_real = fields["spec_num_tokens"] > 0
    num_rows = layout.max_num_reqs
    num_drafts = jax.ops.segment_sum(is_real.astype(jnp.int32), rows, num_rows) - 1
    draft = input_ids[jnp.minimum(fields["spec_logits_indices"] + 1, input_ids.shape[0] - 1)]
    is_mismatch = is_real & (offsets < num_drafts[rows]) & (sampled != draft)
    first_mismatch = jax.ops.segment_min(jnp.where(is_mismatch, offsets, layout.num_spec_tokens), rows, num_rows)
    return jnp.maximum(num_drafts - jnp.minimum(first_mismatch, num_drafts), 0).astype(jnp.int32)


def sample_positions(
    num_drafts: np.ndarray, query_end: np.ndarray, seq_lens: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The host's side: each row's first sampling position, and the SPEC_DECODE_INPUTS
    values. Row r (its tokens end at `query_end[r]`, its drafts last) has 1 + k positions."""
    counts = 1 + num_drafts
    starts = np.cumsum(counts) - counts
    row_of_sample = np.repeat(np.arange(len(counts)), counts)
    offsets = np.arange(int(counts.sum())) - starts[row_of_sample]
    return starts, {
        "spec_sample_rows": row_of_sample,
        "spec_sample_offsets": offsets,
        "spec_logits_indices": (query_end - 1 - num_drafts)[row_of_sample] + offsets,
        "spec_num_tokens": (seq_lens - num_drafts)[row_of_sample] + offsets,
    }


def accepted_tokens(record: StepRecord, sampled: np.ndarray, max_num_samples: int) -> list[list[int]]:
    """Per row, the tokens it keeps: its drafts up to the first that differs from the token
    drawn at its position, then the token drawn there (or after the last draft). `sampled`
    is the step's array: the drawn tokens, then from `max_num_samples` each row's rejected
    drafts (counted on the device, which knows the drafts)."""
    num_rejected = sampled[max_num_samples:]
    token_lists = []
    for i, drafts in enumerate(record.drafts):
        if not record.is_sampling[i]:
            token_lists.append([])
            continue
        start = int(record.sample_starts[i])
        token_lists.append(sampled[start : start + len(drafts) + 1 - int(num_rejected[i])].tolist())
    return token_lists
