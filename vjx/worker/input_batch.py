"""The persistent batch: per-request host state kept across steps, one slot per request.

The scheduler sends diffs (new requests, new blocks, finished ids); the runner applies them
here, so per-step host work scales with what changed, not with the batch.
"""

import dataclasses

import numpy as np

from vjx.lora.request import LoRARequest
from vjx.sampling_params import SamplingParams
from vjx.validation import INT32_MAX
from vjx.worker.block_table import MultiGroupBlockTable
from vjx.worker.step_inputs import (
    STEP_INPUTS,
    StepInput,
    StepInputTable,
    bans_stop_ids_in_bias,
    min_tokens_stop_ids,
)


@dataclasses.dataclass
class CachedRequestState:
    """What the runner remembers of a request, also while it is preempted."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: tuple[list[int], ...]
    """Per KV cache group, the request's blocks in order."""
    eos_token_id: int | None = None
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    """The tokens sampled so far, kept while the request is out of the batch; in the batch
    its row holds them (`InputBatch.token_ids_cpu`), and they come back here when it leaves."""
    prompt_logprobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)
    """Rows of prompt logprobs computed so far (the prompt may take several chunks)."""
    has_sent_prompt_logprobs: bool = False
    lora_request: LoRARequest | None = None
    """The adapter it runs with (None: the base model)."""


class InputBatch:
    """Numpy buffers indexed by slot; a slot holds one request until it leaves the batch.

    `columns` has one array per request column of the step input table, `[max_num_reqs,
    *width]` of the field's dtype and padding, written when a request enters; the other
    buffers are the runner's own bookkeeping.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_blocks_per_req: int,
        num_kv_cache_groups: int = 1,
        table: StepInputTable = STEP_INPUTS,
    ):
        self.max_num_reqs = max_num_reqs
        self.table = table
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}
        self.slot_versions = np.zeros(max_num_reqs, np.int64)
        """Bumped whenever a slot's request enters or leaves: a step's rows still hold the
        requests they held at dispatch where the versions are unchanged."""
        self._free_slots = list(range(max_num_reqs - 1, -1, -1))
        dims = {"R": max_num_reqs}
        self.columns = {row.name: np.full(row.shape(dims), row.padding, row.dtype) for row in table.request_columns}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), np.int32)
        self.num_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_prompt_tokens = self.columns["num_prompt_tokens"]
        self.num_logprobs = self.columns["num_logprobs"]
        self.num_computed_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_prompt_logprobs = np.full(max_num_reqs, -1, np.int32)
        self.min_tokens = np.zeros(max_num_reqs, np.int32)
        self.bans_stop_ids_in_bias = np.zeros(max_num_reqs, bool)
        """The slot's logit bias row bans its request's stop ids until it reaches min_tokens."""
        self.uses_general_step = np.zeros(max_num_reqs, bool)
        """The request filters, processes its logits or wants logprobs: its steps need the
        GENERAL step variant (min_tokens and prompt logprobs are decided per step)."""
        self.block_table = MultiGroupBlockTable(max_num_reqs, max_num_blocks_per_req, num_kv_cache_groups)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, state: CachedRequestState, num_computed_tokens: int) -> int:
        row = self._free_slots.pop()
        self.slot_versions[row] += 1
        self.req_ids[row] = state.req_id
        self.req_id_to_index[state.req_id] = row
        tokens = state.prompt_token_ids + state.output_token_ids
        self.token_ids_cpu[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_computed_tokens[row] = num_computed_tokens
        for column in self.table.request_columns:
            self._set_column(column, row, column.source.value(state))
        params = state.sampling_params
        wants_prompt_logprobs = params.prompt_logprobs is not None and not state.has_sent_prompt_logprobs
        self.num_prompt_logprobs[row] = params.prompt_logprobs if wants_prompt_logprobs else -1
        # min_tokens only bans stop tokens: without any it has nothing to do.
        self.min_tokens[row] = min(params.min_tokens, INT32_MAX) if min_tokens_stop_ids(state) else 0
        self.bans_stop_ids_in_bias[row] = bans_stop_ids_in_bias(state)
        self.uses_general_step[row] = _uses_general_step(params)
        self.block_table.add_row(state.block_ids, row)
        return row

    def _set_column(self, column: StepInput, row: int, value) -> None:
        if column.width is None:
            self.columns[column.name][row] = value
            return
        entries = self.columns[column.name][row]
        entries[...] = column.padding
        entries[: len(value)] = value

    def remove_request(self, req_id: str) -> list[int] | None:
        """Frees the request's slot; returns the tokens it sampled so far (None if absent)."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        output_token_ids = self.token_ids_cpu[row, self.num_prompt_tokens[row] : self.num_tokens[row]].tolist()
        self.slot_versions[row] += 1
        self.req_ids[row] = None
        self.block_table.clear_row(row)
        self._free_slots.append(row)
        return output_token_ids

    def append_tokens(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        """One token to each of `rows` (distinct rows)."""
        self.token_ids_cpu[rows, self.num_tokens[rows]] = token_ids
        self.num_tokens[rows] += 1

    def append_token_list(self, row: int, token_ids: list[int]) -> None:
        """Several tokens to one row (accepted drafts and the token after them)."""
        self.token_ids_cpu[row, self.num_tokens[row] : self.num_tokens[row] + len(token_ids)] = token_ids
        self.num_tokens[row] += len(token_ids)


def _uses_general_step(params: SamplingParams) -> bool:
    uses_filter = params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0
    uses_penalty = params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or params.repetition_penalty != 1.0
    uses_table = bool(params.logit_bias or params.allowed_token_ids or params.bad_words_token_ids)
    return uses_filter or uses_penalty or uses_table or params.logprobs is not None
