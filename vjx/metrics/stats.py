"""The front end's stats: what one batch of EngineCore outputs says about requests' timing.

As vLLM's: time to first token and end-to-end latency run from the request's arrival on the
front end's wall clock (`time.time()`); queue, prefill, decode and inference times and the
inter-token latency are intervals between EngineCore's monotonic timestamps (its events and
each output batch's `timestamp`), so the two clocks are never mixed.
"""

import dataclasses
import time

from vjx.engine.messages import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason


@dataclasses.dataclass
class RequestStateStats:
    """One unfinished request's timing so far."""

    arrival_time: float
    """Front-end wall clock."""
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    queued_ts: float = 0.0
    """EngineCore's monotonic clock, as the three below."""
    scheduled_ts: float = 0.0
    """The first time it was scheduled (a preempted request's later admissions don't count)."""
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclasses.dataclass(frozen=True)
class FinishedRequestStats:
    finish_reason: FinishReason
    e2e_latency: float
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generation_tokens: int
    num_preemptions: int
    max_tokens_param: int | None
    queued_time: float
    """First QUEUED to first SCHEDULED."""
    prefill_time: float
    """First SCHEDULED to the first token (preemptions on the way included)."""
    decode_time: float
    """First token to last token."""
    inference_time: float
    """First SCHEDULED to last token."""
    mean_time_per_output_token: float
    """Decode time over the tokens after the first; 0 for a request of one token."""


@dataclasses.dataclass(frozen=True)
class PromptTokenStats:
    """Prompt tokens of the requests that got their first token, by where their KV came from."""

    computed: int = 0
    local_cache_hit: int = 0

    @property
    def total(self) -> int:
        return self.computed + self.local_cache_hit


class IterationStats:
    """What one batch of EngineCore outputs changed: token counts, latencies, finished requests."""

    def __init__(self) -> None:
        self.iteration_timestamp = time.time()
        self.num_generation_tokens = 0
        self.prompt_token_stats = PromptTokenStats()
        self.num_preempted_reqs = 0
        self.finished_requests: list[FinishedRequestStats] = []
        self.max_num_generation_tokens_iter: list[int] = []
        """Per finished user request: its children's most generated tokens (n > 1), or its own."""
        self.n_params_iter: list[int] = []
        self.time_to_first_tokens_iter: list[float] = []
        self.inter_token_latencies_iter: list[float] = []

    def update_from_output(
        self, output: EngineCoreOutput, engine_core_timestamp: float, num_prompt_tokens: int, stats: RequestStateStats
    ) -> None:
        """Counts one request's output; its first tokens also count its prompt and TTFT."""
        if output.events:
            self.update_from_events(output.events, stats)
        num_new = len(output.new_token_ids)
        if not num_new:
            return
        self.num_generation_tokens += num_new
        if stats.num_generation_tokens == 0:
            cached = min(output.num_cached_tokens, num_prompt_tokens)
            prompt = self.prompt_token_stats
            self.prompt_token_stats = PromptTokenStats(
                prompt.computed + num_prompt_tokens - cached, prompt.local_cache_hit + cached
            )
            self.time_to_first_tokens_iter.append(self.iteration_timestamp - stats.arrival_time)
            stats.first_token_ts = engine_core_timestamp
        else:
            self.inter_token_latencies_iter.append(engine_core_timestamp - stats.last_token_ts)
        stats.num_generation_tokens += num_new
        stats.last_token_ts = engine_core_timestamp

    def update_from_events(self, events: list[EngineCoreEvent], stats: RequestStateStats) -> None:
        for event in events:
            if event.type == EngineCoreEventType.QUEUED:
                stats.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED:
                if stats.scheduled_ts == 0.0:
                    stats.scheduled_ts = event.timestamp
            elif event.type == EngineCoreEventType.PREEMPTED:
                self.num_preempted_reqs += 1
                stats.num_preemptions += 1

    def update_from_finished_request(
        self,
        finish_reason: FinishReason,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        max_tokens_param: int | None,
        stats: RequestStateStats,
    ) -> None:
        decode_time = stats.last_token_ts - stats.first_token_ts
        num_later_tokens = stats.num_generation_tokens - 1
        self.finished_requests.append(
            FinishedRequestStats(
                finish_reason=finish_reason,
                e2e_latency=self.iteration_timestamp - stats.arrival_time,
                num_prompt_tokens=num_prompt_tokens,
                num_cached_tokens=max(num_cached_tokens, 0),
                num_generation_tokens=stats.num_generation_tokens,
                num_preemptions=stats.num_preemptions,
                max_tokens_param=max_tokens_param,
                queued_time=stats.scheduled_ts - stats.queued_ts,
                prefill_time=stats.first_token_ts - stats.scheduled_ts,
                decode_time=decode_time,
                inference_time=stats.last_token_ts - stats.scheduled_ts,
                mean_time_per_output_token=decode_time / num_later_tokens if num_later_tokens > 0 else 0.0,
            )
        )

    def observe_user_request(self, n: int, max_num_generation_tokens: int) -> None:
        """A user request finished: all its `n` children (or itself, when n == 1)."""
        self.n_params_iter.append(n)
        self.max_num_generation_tokens_iter.append(max_num_generation_tokens)
