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

With speculative decoding the drafts are placeholders too: the drafter runs on the device
after each step, and the scheduler never sees a draft's id. A step that reaches the end of
a request's tokens adds one placeholder for the token it samples and one per draft it
verifies, as if every draft were accepted, and gives the request `[-1] * m` drafts for its
next step. When the step's tokens come back, the rejected drafts are taken back from both
`num_computed_tokens` and the placeholders (the runner has already placed the next step's
tokens at their true positions on the device). Between steps a decoding request looks as
in the synchronous scheduler, its placeholders standing in for tokens:

    | num_tokens known | placeholders (in flight) | spec_token_ids: m drafts (-1) |
    |<--- num_computed_tokens --->|<----- the next step: 1 + m tokens ------>|

Blocks enter the prefix cache only up to the known tokens, so no placeholder is ever hashed.
"""

from vjx.core.request import Request, RequestStatus
from vjx.core.sched.output import SchedulerOutput
from vjx.core.sched.scheduler import Scheduler
from vjx.core.sched.utils import append_until_stop

_DRAFT_PLACEHOLDER = -1
"""The id of a draft in flight: the runner keeps the true ids on the device."""


class AsyncScheduler(Scheduler):
    """The scheduler for `async_scheduling=True`."""

    def _num_new_tokens(self, request: Request, num_computed_tokens: int) -> int:
        num_placeholders = self.num_output_placeholders.get(request.request_id, 0)
        if num_placeholders == 0:
            return super()._num_new_tokens(request, num_computed_tokens)
        # A preempted request is recomputed from known tokens only, so it waits for its
        # tokens in flight (with two steps in flight they land before it could resume).
        if request.status is not RequestStatus.RUNNING:
            return 0
        # When the tokens in flight reach a length limit (counting every draft in flight as
        # accepted), another step would compute a token dropped for sure; if drafts are
        # rejected, a later step goes on. A stop token cannot be foreseen: the step after
        # it is computed, and its token dropped.
        num_tokens = request.num_tokens + num_placeholders
        max_tokens = request.max_tokens
        if num_tokens >= self.max_model_len or (
            max_tokens is not None and num_tokens - request.num_prompt_tokens >= max_tokens
        ):
            return 0
        return num_tokens + len(request.spec_token_ids) - num_computed_tokens

    def _advance_computed_tokens(self, scheduler_output: SchedulerOutput) -> None:
        # Advances the tokens and counts the placeholders in one pass (every request, every step).
        placeholders = self.num_output_placeholders
        requests = self.requests
        spec_decode_tokens = scheduler_output.scheduled_spec_decode_tokens
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = requests[req_id]
            request.num_computed_tokens += num_tokens
            num_placeholders = placeholders.get(req_id, 0)
            num_drafts = len(spec_decode_tokens[req_id]) if req_id in spec_decode_tokens else 0
            if request.num_computed_tokens == request.num_tokens + num_placeholders + num_drafts:
                # The step reaches the request's last token, so it samples the next one, and
                # it verifies its drafts: all of them are counted as accepted until it is back.
                num_placeholders += 1 + num_drafts
                placeholders[req_id] = num_placeholders
                if self.num_spec_tokens:
                    request.spec_token_ids = [_DRAFT_PLACEHOLDER] * self._max_drafts(request, num_placeholders)
        if self.num_spec_tokens:
            self._drop_stale_drafts(scheduler_output)

    def _drop_stale_drafts(self, scheduler_output: SchedulerOutput) -> None:
        """A request's drafts are proposed after its step, for the next one only: one left out
        of this step (the budget ran out) has no drafts when it comes back."""
        for request in self.running:
            if request.spec_token_ids and request.request_id not in scheduler_output.num_scheduled_tokens:
                request.spec_token_ids = []

    def _max_drafts(self, request: Request, num_placeholders: int) -> int:
        """How many drafts the request's next step may verify, counting its tokens in flight
        as its own (as the runner's `_max_drafts` counts its true tokens): none for a
        constrained request (its masks need every token) or below `min_tokens` (the
        stop-token bans change per position; the count is exact until a request's first
        drafts, so one with drafts in flight is past min_tokens for sure); else up to
        max_model_len, and one short of max_tokens (the step adds one)."""
        if request.structured_output_request is not None:
            return 0
        num_tokens = request.num_tokens + num_placeholders
        num_outputs = num_tokens - request.num_prompt_tokens
        if num_outputs < request.sampling_params.min_tokens:
            return 0
        limit = min(self.num_spec_tokens, self.max_model_len - num_tokens)
        if request.max_tokens is not None:
            limit = min(limit, request.max_tokens - num_outputs - 1)
        return max(limit, 0)

    @staticmethod
    def _may_draft(request: Request) -> bool:
        """Never from the runner's output: the drafts stay on the device, and the request's
        placeholder drafts were set when its step was scheduled."""
        return False

    def _update_request_with_output(
        self, request: Request, sampled_token_ids: list[int], drafts: list[int] | None = None
    ) -> tuple[list[int], bool]:
        """As the scheduler's; the step's placeholders become its sampled tokens, and those of
        its rejected drafts go."""
        req_id = request.request_id
        if not self.num_output_placeholders.get(req_id) or not sampled_token_ids:
            # No token of this request was in flight: the row was a partial prefill.
            return [], False
        if drafts:
            self._reject_drafts(request, drafts, len(sampled_token_ids) - 1)
        self.num_output_placeholders[req_id] -= len(sampled_token_ids)
        return append_until_stop(request, sampled_token_ids, self.max_model_len)

    def _reject_drafts(self, request: Request, drafts: list[int], num_accepted: int) -> None:
        """As the scheduler's, and the rejected drafts' placeholders go too. A request
        preempted since the step was scheduled has no computed tokens to take back."""
        num_rejected = len(drafts) - num_accepted
        self.num_output_placeholders[request.request_id] -= num_rejected
        if request.status is RequestStatus.RUNNING:
            request.num_computed_tokens -= num_rejected
        self._observe_drafts(request, len(drafts), num_accepted)

    def _free_request(self, request: Request) -> None:
        self.num_output_placeholders.pop(request.request_id, None)
        super()._free_request(request)
