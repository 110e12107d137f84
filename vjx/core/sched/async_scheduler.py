"""AsyncScheduler: plans step N+1 while the device still runs step N.

A step that reaches the end of a request's tokens samples one more. The synchronous
scheduler waits for that token before scheduling the request again; this one counts it as
an output placeholder at once, so the next step can compute it as an input, and the model
runner fills its value in on the device from step N's sampled ids. The engine keeps at most
two steps in flight: schedule N+1, then update from N, then schedule N+2, and so on.

Per request, the placeholders are the sampled tokens not back yet: a request has
`num_tokens + placeholders` tokens, and `num_computed_tokens` counts the placeholders it is
computing. `update_from_output` turns placeholders into tokens and checks stops; a request
that stops while its next step is already in flight is freed at once, and that step's
token for it is dropped (the step ran one wasted row, as in vLLM).
"""

from vjx.config import CacheConfig, SchedulerConfig
from vjx.core.request import Request, RequestStatus
from vjx.core.sched.scheduler import Scheduler
from vjx.core.sched.utils import append_until_stop
from vjx.kv_cache_interface import KVCacheConfig


class AsyncScheduler(Scheduler):
    """The scheduler for `async_scheduling=True`."""

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        kv_cache_config: KVCacheConfig,
        structured_output_manager=None,
    ) -> None:
        super().__init__(scheduler_config, cache_config, kv_cache_config, structured_output_manager)
        self.num_output_placeholders: dict[str, int] = {}
        """Per request, tokens sampled by steps in flight; absent means none."""

    def _num_new_tokens(self, request: Request, num_computed_tokens: int) -> int:
        num_placeholders = self.num_output_placeholders.get(request.request_id, 0)
        if num_placeholders == 0:
            return super()._num_new_tokens(request, num_computed_tokens)
        # A preempted request is recomputed from known tokens only, so it waits for its
        # token in flight (with two steps in flight that token lands before it could resume).
        if request.status is not RequestStatus.RUNNING:
            return 0
        # When the tokens in flight reach a length limit, another step would compute a
        # token dropped for sure. A stop token cannot be foreseen: the step after it is
        # computed, and its token dropped.
        num_tokens = request.num_tokens + num_placeholders
        max_tokens = request.max_tokens
        if num_tokens >= self.max_model_len or (
            max_tokens is not None and num_tokens - request.num_prompt_tokens >= max_tokens
        ):
            return 0
        return num_tokens - num_computed_tokens

    def _advance_computed_tokens(self, num_scheduled_tokens: dict[str, int]) -> None:
        # Advances the tokens and counts the placeholders in one pass (every request, every step).
        placeholders = self.num_output_placeholders
        requests = self.requests
        for req_id, num_tokens in num_scheduled_tokens.items():
            request = requests[req_id]
            request.num_computed_tokens += num_tokens
            num_placeholders = placeholders.get(req_id, 0)
            if request.num_computed_tokens == request.num_tokens + num_placeholders:
                # The step reaches the request's last token, so it samples the next one.
                placeholders[req_id] = num_placeholders + 1

    def _update_request_with_output(
        self, request: Request, sampled_token_ids: list[int], drafts: list[int] | None = None
    ) -> tuple[list[int], bool]:
        """As the scheduler's; drafts never come here (speculative decoding runs synchronously)."""
        num_placeholders = self.num_output_placeholders.get(request.request_id, 0)
        if num_placeholders == 0 or not sampled_token_ids:
            # No token of this request was in flight: the row was a partial prefill.
            return [], False
        self.num_output_placeholders[request.request_id] = num_placeholders - len(sampled_token_ids)
        return append_until_stop(request, sampled_token_ids, self.max_model_len)

    def _free_request(self, request: Request) -> None:
        self.num_output_placeholders.pop(request.request_id, None)
        super()._free_request(request)
