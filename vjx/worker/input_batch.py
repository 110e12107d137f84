"""The persistent batch: per-request host state kept across steps, one slot per request.

The scheduler sends diffs (new requests, new blocks, finished ids); the runner applies them
here, so per-step host work scales with what changed, not with the batch.
"""

import dataclasses

import numpy as np

from vjx.sampling_params import MAX_MIN_TOKENS_STOP_IDS, SamplingParams
from vjx.worker.block_table import BlockTable


@dataclasses.dataclass
class CachedRequestState:
    """What the runner remembers of a request, also while it is preempted."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    eos_token_id: int | None = None
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    """The tokens sampled so far, kept while the request is out of the batch; in the batch
    its row holds them (`InputBatch.token_ids_cpu`), and they come back here when it leaves."""
    prompt_logprobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)
    """Rows of prompt logprobs computed so far (the prompt may take several chunks)."""
    has_sent_prompt_logprobs: bool = False


class InputBatch:
    """Numpy buffers indexed by slot; a slot holds one request until it leaves the batch."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int):
        self.max_num_reqs = max_num_reqs
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}
        self.slot_versions = np.zeros(max_num_reqs, np.int64)
        """Bumped whenever a slot's request enters or leaves: a step's rows still hold the
        requests they held at dispatch where the versions are unchanged."""
        self._free_slots = list(range(max_num_reqs - 1, -1, -1))
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), np.int32)
        self.num_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_computed_tokens = np.zeros(max_num_reqs, np.int32)
        self.temperature = np.zeros(max_num_reqs, np.float32)
        self.top_k = np.zeros(max_num_reqs, np.int32)
        self.top_p = np.ones(max_num_reqs, np.float32)
        self.seeds = np.zeros(max_num_reqs, np.int32)
        self.min_p = np.zeros(max_num_reqs, np.float32)
        self.presence_penalty = np.zeros(max_num_reqs, np.float32)
        self.frequency_penalty = np.zeros(max_num_reqs, np.float32)
        self.repetition_penalty = np.ones(max_num_reqs, np.float32)
        self.num_logprobs = np.full(max_num_reqs, -1, np.int32)
        self.num_prompt_logprobs = np.full(max_num_reqs, -1, np.int32)
        self.min_tokens = np.zeros(max_num_reqs, np.int32)
        self.has_logit_bias = np.zeros(max_num_reqs, bool)
        self.uses_general_step = np.zeros(max_num_reqs, bool)
        """The request filters, processes its logits or wants logprobs: its steps need the
        GENERAL step variant (min_tokens and prompt logprobs are decided per step)."""
        self.min_tokens_stop_ids = np.full((max_num_reqs, MAX_MIN_TOKENS_STOP_IDS), -1, np.int32)
        self.block_table = BlockTable(max_num_reqs, max_num_blocks_per_req)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, state: CachedRequestState, num_computed_tokens: int) -> int:
        row = self._free_slots.pop()
        self.slot_versions[row] += 1
        self.req_ids[row] = state.req_id
        self.req_id_to_index[state.req_id] = row
        num_prompt = len(state.prompt_token_ids)
        tokens = state.prompt_token_ids + state.output_token_ids
        self.token_ids_cpu[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_prompt_tokens[row] = num_prompt
        self.num_computed_tokens[row] = num_computed_tokens
        params = state.sampling_params
        self.temperature[row] = params.temperature
        self.top_k[row] = params.top_k
        self.top_p[row] = params.top_p
        self.seeds[row] = state.seed
        self.min_p[row] = params.min_p
        self.presence_penalty[row] = params.presence_penalty
        self.frequency_penalty[row] = params.frequency_penalty
        self.repetition_penalty[row] = params.repetition_penalty
        self.num_logprobs[row] = -1 if params.logprobs is None else params.logprobs
        wants_prompt_logprobs = params.prompt_logprobs is not None and not state.has_sent_prompt_logprobs
        self.num_prompt_logprobs[row] = params.prompt_logprobs if wants_prompt_logprobs else -1
        self._set_min_tokens(row, state)
        self.has_logit_bias[row] = bool(params.logit_bias or params.allowed_token_ids)
        self.uses_general_step[row] = _uses_general_step(params)
        self.block_table.add_row(state.block_ids, row)
        return row

    def _set_min_tokens(self, row: int, state: CachedRequestState) -> None:
        params = state.sampling_params
        stop_ids = list(params.stop_token_ids)
        if state.eos_token_id is not None and not params.ignore_eos:
            stop_ids.append(state.eos_token_id)
        self.min_tokens[row] = params.min_tokens if stop_ids else 0
        self.min_tokens_stop_ids[row] = -1
        self.min_tokens_stop_ids[row, : len(stop_ids)] = stop_ids

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


def _uses_general_step(params: SamplingParams) -> bool:
    uses_filter = params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0
    uses_penalty = (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
                    or params.repetition_penalty != 1.0)
    uses_table = bool(params.logit_bias or params.allowed_token_ids or params.bad_words_token_ids)
    return uses_filter or uses_penalty or uses_table or params.logprobs is not None
