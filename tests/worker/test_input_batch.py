"""InputBatch: a request's sampled tokens live in its row while it is in the batch, and come
back to its state when it leaves; slot versions tell whether a row still holds its request."""

import numpy as np

from vjx.sampling_params import SamplingParams
from vjx.worker.input_batch import CachedRequestState, InputBatch


def _state(req_id: str, prompt: list[int]) -> CachedRequestState:
    return CachedRequestState(req_id, prompt, SamplingParams(max_tokens=8), seed=0, block_ids=([1],))


def test_tokens_appended_to_rows_come_back_when_the_request_leaves():
    batch = InputBatch(max_num_reqs=4, max_model_len=16, max_num_blocks_per_req=2)
    a, b = _state("a", [5, 6, 7]), _state("b", [9])
    rows = np.array([batch.add_request(a, 3), batch.add_request(b, 1)])
    versions = batch.slot_versions[rows].copy()
    batch.append_tokens(rows, np.array([20, 30]))
    batch.append_tokens(rows[:1], np.array([21]))

    assert batch.token_ids_cpu[rows[0], :5].tolist() == [5, 6, 7, 20, 21]
    assert batch.num_tokens[rows].tolist() == [5, 2]
    assert batch.remove_request("a") == [20, 21]
    assert batch.remove_request("a") is None
    assert (batch.slot_versions[rows] == versions).tolist() == [False, True]


def test_a_returning_request_gets_its_prompt_and_outputs_back():
    batch = InputBatch(max_num_reqs=2, max_model_len=16, max_num_blocks_per_req=2)
    state = _state("a", [5, 6])
    state.output_token_ids = [40, 41]
    row = batch.add_request(state, 3)
    assert batch.token_ids_cpu[row, :4].tolist() == [5, 6, 40, 41]
    assert batch.num_tokens[row] == 4 and batch.num_computed_tokens[row] == 3
    assert batch.remove_request("a") == [40, 41]
