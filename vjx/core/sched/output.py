"""What the scheduler decided for one step, as a diff against the runner's persistent batch."""

import dataclasses

import numpy as np

from vjx.lora.request import LoRARequest
from vjx.sampling_params import SamplingParams


@dataclasses.dataclass
class NewRequestData:
    """A request the runner has not seen (or has dropped): everything it needs to run it."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]
    """One block id list per KV cache group."""
    num_computed_tokens: int
    eos_token_id: int | None = None
    """Held back, with the stop token ids, while the request is below `min_tokens`."""
    lora_request: LoRARequest | None = None
    """The adapter it runs with (None: the base model)."""


@dataclasses.dataclass
class CachedRequestData:
    """Requests the runner already holds: only what changed, row by row."""

    req_ids: list[str] = dataclasses.field(default_factory=list)
    resumed_from_preemption: list[bool] = dataclasses.field(default_factory=list)
    """True: `new_block_ids` replaces the request's blocks instead of extending them."""
    new_block_ids: list[tuple[list[int], ...] | None] = dataclasses.field(default_factory=list)
    num_computed_tokens: list[int] = dataclasses.field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclasses.dataclass
class SchedulerOutput:
    """One step: which requests run and how many tokens each computes."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    """Requests finished or aborted since the last step: the runner drops their state."""
    scheduled_spec_decode_tokens: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Per request with drafts: the draft tokens among its scheduled tokens (its last
    `len(drafts)` ones), which the step verifies."""
    grammar_bitmask: np.ndarray | None = None
    """int32 [rows, ceil(V / 32)]: bit v of a row allows token v; the requests of
    `num_scheduled_tokens` in order, one row each, and with drafts one more per draft (the
    mask after the drafts before it); None when no request of the step is constrained. Set by
    `Scheduler.get_grammar_bitmask` just before the step is dispatched."""
