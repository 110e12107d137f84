"""Messages between the front end (LLMEngine, AsyncLLM) and EngineCore.

Plain data, no behaviour: the scheduler builds outputs, the output processor reads them.
"""

import dataclasses
import enum
import time

from vjx.lora.request import LoRARequest
from vjx.outputs import LogprobsLists
from vjx.sampling_params import SamplingParams
from vjx.spec_decode.request_metrics import RequestSpecDecodeMetrics


class FinishReason(enum.IntEnum):
    """Why a request finished; `str()` gives the OpenAI API's word."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    """The engine could not run the request (its error is in the engine's log)."""

    def __str__(self) -> str:
        return self.name.lower()


@dataclasses.dataclass
class EngineCoreRequest:
    """A tokenized, validated request on its way into EngineCore."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None
    """Mixed into the first block's hash, so only requests with the same salt share a prefix."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter to run with (`enable_lora`); None: the base model."""


class EngineCoreEventType(enum.IntEnum):
    """A step of a request's life in the scheduler, for its queue, prefill and decode times."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclasses.dataclass
class EngineCoreEvent:
    """When a request changed state in EngineCore, on EngineCore's `time.monotonic()` clock: only
    intervals between these and `EngineCoreOutputs.timestamp` mean anything."""

    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def new_event(cls, event_type: EngineCoreEventType) -> "EngineCoreEvent":
        return cls(event_type, time.monotonic())


@dataclasses.dataclass
class EngineCoreOutput:
    """New tokens of one request after one step."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    new_logprobs: LogprobsLists | None = None
    """One row per new token, when the request asked for `logprobs`."""
    new_prompt_logprobs: LogprobsLists | None = None
    """One row per prompt token after the first, when it asked for `prompt_logprobs`; sent
    once, with the request's first output."""
    events: list[EngineCoreEvent] | None = dataclasses.field(default=None, compare=False)
    """The request's events since its previous output, oldest first. Timing, not content:
    left out of `==`, as `EngineCoreOutputs.timestamp`."""
    spec_decode_metrics: RequestSpecDecodeMetrics | None = None
    """Its speculative decoding, with per_request_spec_decode_metrics: sent once, with the
    output that finishes it."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class EngineCoreOutputs:
    """Everything one `EngineCore.step` produced."""

    outputs: list[EngineCoreOutput] = dataclasses.field(default_factory=list)
    finished_requests: set[str] = dataclasses.field(default_factory=set)
    timestamp: float = dataclasses.field(default_factory=time.monotonic, compare=False)
    """When the step's tokens were known (EngineCore's monotonic clock, as its events')."""
