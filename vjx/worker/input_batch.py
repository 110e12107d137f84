"""The persistent batch: per-request host state kept across steps, one slot per request.

The scheduler sends diffs (new requests, new blocks, finished ids); the runner applies them
here, so per-step host work scales with what changed, not with the batch.
"""

import dataclasses

import numpy as np

from vjx.sampling_params import SamplingParams
from vjx.worker.block_table import BlockTable


@dataclasses.dataclass
class CachedRequestState:
    """What the runner remembers of a request, also while it is preempted."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = dataclasses.field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    """Numpy buffers indexed by slot; a slot holds one request until it leaves the batch."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int):
        self.max_num_reqs = max_num_reqs
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}
        self._free_slots = list(range(max_num_reqs - 1, -1, -1))
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), np.int32)
        self.num_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_computed_tokens = np.zeros(max_num_reqs, np.int32)
        self.temperature = np.zeros(max_num_reqs, np.float32)
        self.top_k = np.zeros(max_num_reqs, np.int32)
        self.top_p = np.ones(max_num_reqs, np.float32)
        self.seeds = np.zeros(max_num_reqs, np.int32)
        self.block_table = BlockTable(max_num_reqs, max_num_blocks_per_req)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, state: CachedRequestState) -> int:
        row = self._free_slots.pop()
        self.req_ids[row] = state.req_id
        self.req_id_to_index[state.req_id] = row
        num_prompt = len(state.prompt_token_ids)
        tokens = state.prompt_token_ids + state.output_token_ids
        self.token_ids_cpu[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_prompt_tokens[row] = num_prompt
        self.num_computed_tokens[row] = state.num_computed_tokens
        params = state.sampling_params
        self.temperature[row] = params.temperature
        self.top_k[row] = params.top_k
        self.top_p[row] = params.top_p
        self.seeds[row] = state.seed
        self.block_table.add_row(state.block_ids, row)
        return row

    def remove_request(self, req_id: str) -> int | None:
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.block_table.clear_row(row)
        self._free_slots.append(row)
        return row

    def append_token(self, row: int, token_id: int) -> None:
        self.token_ids_cpu[row, self.num_tokens[row]] = token_id
        self.num_tokens[row] += 1
