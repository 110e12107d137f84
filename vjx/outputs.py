"""Output objects: what users get back (vLLM's `RequestOutput`) and what a step returns."""

import dataclasses
from collections.abc import Callable

from vjx.spec_decode.request_metrics import RequestSpecDecodeMetrics


@dataclasses.dataclass
class Logprob:
    """One candidate token's log probability at one position (vLLM's `Logprob`)."""

    logprob: float
    rank: int | None = None
    """1-based rank in the vocabulary at that position (1 = most likely)."""
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
"""Per generated token: {token id: Logprob} for the sampled token and the top candidates."""
PromptLogprobs = list[dict[int, Logprob] | None]
"""Per prompt token: as above with the prompt token in place of the sampled one; None first."""


@dataclasses.dataclass
class LogprobsLists:
    """Logprobs of several positions as host lists, as they leave the engine core.

    Row i is one position: `logprob_token_ids[i][0]` is the chosen (sampled or prompt) token
    and the rest are the top candidates, best first; `logprobs[i]` matches it;
    `sampled_token_ranks[i]` is the chosen token's 1-based rank.
    """

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]


@dataclasses.dataclass
class CompletionOutput:
    """One completion of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list | None = None
    finish_reason: str | None = None
    """"stop" (EOS, a stop token or a stop string), "length", "abort" or "error" (the engine
    could not run the request); None while running."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the completion; None for EOS or length."""
    spec_decode_metrics: RequestSpecDecodeMetrics | None = None
    """Its speculative decoding, on the final output when per_request_spec_decode_metrics is
    on; None otherwise, and for a completion a stop string or an abort ended."""

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    """The state of one request: its prompt and its completions so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list | None = None
    num_cached_tokens: int | None = None
    """Prompt tokens whose KV came from the prefix cache."""


@dataclasses.dataclass
class ModelRunnerOutput:
    """What one executed step hands back to the scheduler (host lists, no device arrays)."""

    req_ids: list[str]
    """Requests of the step, in the runner's row order."""
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    """Per row, the tokens sampled this step: one token, or none for a partial prefill."""
    logprobs: dict[str, LogprobsLists] = dataclasses.field(default_factory=dict)
    """For requests that asked for logprobs and sampled: one row per sampled token."""
    prompt_logprobs: dict[str, LogprobsLists] = dataclasses.field(default_factory=dict)
    """For requests that asked for prompt logprobs, once their whole prompt is computed."""
    failed_req_ids: set[str] = dataclasses.field(default_factory=set)
    """Scheduled requests the runner could not run (the error is logged): the scheduler
    finishes them with `FinishReason.ERROR`; the rest of the step ran."""
    spec_token_ids: list[list[int]] | None = None
    """Speculative decoding: per row, the drafts proposed for the request's next step."""


@dataclasses.dataclass
class AsyncModelRunnerOutput:
    """A dispatched step whose tokens are still on the device; `get_output()` waits for them."""

    _collect: Callable[[], ModelRunnerOutput]

    def get_output(self) -> ModelRunnerOutput:
        return self._collect()
