"""The n-gram proposer (prompt lookup decoding), on the host over a request's own tokens.

For n from `prompt_lookup_max` down to `prompt_lookup_min`, the request's last n tokens are
looked for earlier in its tokens (prompt and output); at the first n that matches, the
tokens that followed the match are the drafts, up to k of them. As in vLLM, the longest
n-gram wins, and among its matches the earliest.
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from vjx.config import SpeculativeConfig
from vjx.worker.input_batch import InputBatch
from vjx.worker.step_outputs import StepRecord


class NgramProposer:
    def __init__(self, speculative_config: SpeculativeConfig, input_batch: InputBatch | None = None):
        self.min_n = speculative_config.prompt_lookup_min
        self.max_n = speculative_config.prompt_lookup_max
        self.k = speculative_config.num_speculative_tokens
        self.batch = input_batch

    def compile(self) -> None:
        """Nothing runs on the device."""

    def request_entered(self, row: int, num_computed_tokens: int) -> None:
        """The proposer keeps no state per request."""

    def propose_batch(
        self, record: StepRecord, token_lists: list[list[int]], limits: list[int], target_hidden=None
    ) -> list[list[int]]:
        """Per row of the step, up to `limits[i]` drafts from its tokens in the batch."""
        batch = self.batch
        return [
            self.propose(batch.token_ids_cpu[row, : batch.num_tokens[row]], limit) if limit > 0 else []
            for row, limit in zip(record.rows.tolist(), limits)
        ]

    def propose(self, token_ids: np.ndarray, max_drafts: int) -> list[int]:
        """Up to min(k, `max_drafts`) drafts for the request whose tokens are `token_ids`."""
        num_drafts = min(self.k, max_drafts)
        num_tokens = len(token_ids)
        if num_drafts <= 0:
            return []
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            # Windows that start early enough to end before the suffix itself.
            windows = sliding_window_view(token_ids[: num_tokens - 1], n)
            matches = np.flatnonzero((windows == token_ids[num_tokens - n :]).all(axis=1))
            if len(matches):
                start = int(matches[0]) + n
                return token_ids[start : start + num_drafts].tolist()
        return []
