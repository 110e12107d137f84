"""What the runner remembers of a dispatched step, and how its logprobs reach the host.

The step returns logprobs arrays of a static width for every row; only the rows (and
columns) a request asked for are copied to the host, and only when some request asked.
"""

import dataclasses

import numpy as np

from vjx.outputs import LogprobsLists, ModelRunnerOutput
from vjx.worker.input_batch import CachedRequestState


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """A dispatched step, row by row in its order (rows are requests, decode-first)."""

    req_ids: list[str]
    rows: np.ndarray
    """Per row: its persistent-batch slot."""
    slot_versions: np.ndarray
    """Per row: `InputBatch.slot_versions` of its slot at dispatch."""
    is_sampling: np.ndarray
    """Per row: the step reaches the end of the request's tokens and samples the next one."""
    num_logprobs: np.ndarray
    """Per row: the request's `logprobs` (-1: none)."""
    may_send_prompt_logprobs: np.ndarray
    """Per row: the request asked for prompt logprobs, unsent when it entered the batch."""
    token_rows: np.ndarray
    """Per real token of the step: its row."""
    has_prompt_target: np.ndarray
    """Per real token: the step computes the logprob of the prompt token after it."""
    seq_lens: np.ndarray | None = None
    """Per row: its tokens computed once the step has run (drafts included)."""
    drafts: list[list[int]] | None = None
    """Per row, the draft tokens the step verifies (speculative decoding; else None)."""
    sample_starts: np.ndarray | None = None
    """Per row, its first sampling position (speculative decoding); None: row i samples at i."""


def _lists(ids: np.ndarray, logprobs: np.ndarray, ranks: np.ndarray, width: int) -> LogprobsLists:
    return LogprobsLists(ids[:, :width].tolist(), logprobs[:, :width].tolist(), ranks.tolist())


def collect_logprobs(
    record: StepRecord,
    logprobs,
    prompt_logprobs,
    requests: dict[str, CachedRequestState],
    output: ModelRunnerOutput,
) -> None:
    """Fills `output.logprobs` and `output.prompt_logprobs` from the step's device arrays.

    Prompt logprobs accumulate over a prompt's chunks in the request's state and go out
    once, with the step that completes the prompt.
    """
    wants = record.is_sampling & (record.num_logprobs >= 0)
    if wants.any():
        ids, lps, ranks = (np.asarray(a) for a in logprobs)
        for i in np.flatnonzero(wants):
            # One logprobs row per token the request keeps, from its first sampling position.
            start = i if record.sample_starts is None else int(record.sample_starts[i])
            rows = slice(start, start + len(output.sampled_token_ids[i]))
            width = int(record.num_logprobs[i]) + 1
            output.logprobs[record.req_ids[i]] = _lists(ids[rows], lps[rows], ranks[rows], width)
    if record.has_prompt_target.any():
        ids, lps, ranks = (np.asarray(a) for a in prompt_logprobs)
        for t in np.flatnonzero(record.has_prompt_target):
            state = requests.get(record.req_ids[record.token_rows[t]])
            if state is not None:
                state.prompt_logprobs.append((ids[t], lps[t], ranks[t]))
    for i in np.flatnonzero(record.is_sampling & record.may_send_prompt_logprobs):
        state = requests.get(record.req_ids[i])
        if state is None or state.sampling_params.prompt_logprobs is None or state.has_sent_prompt_logprobs:
            continue
        width = state.sampling_params.prompt_logprobs + 1
        rows = state.prompt_logprobs
        # A one-token prompt has no prompt logprob to send (its first token never has one).
        output.prompt_logprobs[state.req_id] = (
            _lists(*(np.stack(column) for column in zip(*rows)), width) if rows else LogprobsLists([], [], [])
        )
        state.prompt_logprobs = []
        state.has_sent_prompt_logprobs = True
