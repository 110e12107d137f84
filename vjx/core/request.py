"""The scheduler's view of one request: its tokens, its progress and its status."""

import enum
from typing import TYPE_CHECKING

from vjx.core.kv_cache_utils import BlockHash
from vjx.engine.messages import EngineCoreEvent, EngineCoreEventType, EngineCoreRequest, FinishReason
from vjx.lora.request import LoRARequest
from vjx.sampling_params import SamplingParams
from vjx.spec_decode.request_metrics import RequestSpecDecodeMetrics

if TYPE_CHECKING:
    from vjx.structured_output.request import StructuredOutputRequest


class RequestStatus(enum.IntEnum):
    """Where a request is in its life; every status after PREEMPTED is a finished one."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> FinishReason | None:
        """The API's finish reason of a finished status; None while the request is alive."""
        return _FINISHED_REASONS.get(status)


_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    """One request's mutable state, owned by the scheduler.

    `all_token_ids` is the prompt followed by the outputs; `num_computed_tokens` of them have
    their K/V in the cache (or will have once the step scheduled last has run).
    `block_hashes` holds the chained hashes of the request's full blocks; the KV cache
    manager extends it as tokens arrive, because only the manager knows the block size.
    Change the token lists only through `append_output_token_ids`, which keeps them in step.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        arrival_time: float,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        """Mixed into the hash of the first block, so only requests with the same salt share
        cached prefixes (one tenant cannot probe another's prompts by timing)."""
        self.lora_request = lora_request
        """The adapter it runs with (None: the base model); its name is mixed into the first
        block's hash like the salt, since an adapter changes every layer's K/V."""
        self.max_tokens = sampling_params.max_tokens
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_prompt_tokens = len(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        """Prompt tokens found in the prefix cache when first scheduled; -1 until then."""
        self.num_preemptions = 0
        self.block_hashes: list[BlockHash] = []
        self.events: list[EngineCoreEvent] = []
        """Scheduler events not yet sent with an output (for the front end's timing metrics)."""
        self.structured_output_request: StructuredOutputRequest | None = None
        """Its grammar, when its sampling params constrain the output (set by the engine core)."""
        self.spec_token_ids: list[int] = []
        """Draft tokens proposed for its next step (speculative decoding), verified there."""
        self.spec_decode_metrics: RequestSpecDecodeMetrics | None = None
        """Its verify steps' counts, with per_request_spec_decode_metrics (set by the scheduler)."""

    @classmethod
    def from_engine_core_request(cls, request: EngineCoreRequest) -> "Request":
        return cls(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id,
            arrival_time=request.arrival_time,
            priority=request.priority,
            cache_salt=request.cache_salt,
            lora_request=request.lora_request,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """Its tokens and its drafts: what the next step may compute."""
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            self.output_token_ids.append(token_ids)
            self.all_token_ids.append(token_ids)
            return
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def record_event(self, event_type: EngineCoreEventType) -> None:
        self.events.append(EngineCoreEvent.new_event(event_type))

    def take_events(self) -> list[EngineCoreEvent] | None:
        """The events since the last call, or None when there were none."""
        if not self.events:
            return None
        events, self.events = self.events, []
        return events

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )
