"""The scheduler: which requests run each step, and how many tokens each computes."""

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from vjx.config import CacheConfig, SchedulerConfig
from vjx.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vjx.core.request import Request, RequestStatus
from vjx.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vjx.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vjx.core.sched.stats import SchedulerStats, SpecDecodingStats
from vjx.core.sched.utils import append_until_stop
from vjx.engine.messages import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, FinishReason
from vjx.kv_cache_interface import KVCacheConfig
from vjx.outputs import ModelRunnerOutput
from vjx.spec_decode.request_metrics import RequestSpecDecodeMetrics

if TYPE_CHECKING:
    from vjx.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)


def _verify_config(scheduler_config: SchedulerConfig, kv_cache_config: KVCacheConfig) -> None:
    """Refuse settings under which some valid request could wait forever."""
    max_model_len = scheduler_config.max_model_len
    max_num_batched_tokens = scheduler_config.max_num_batched_tokens
    is_chunked = scheduler_config.enable_chunked_prefill
    if not is_chunked and max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens={max_num_batched_tokens} must be at least "
            f"max_model_len={max_model_len} when chunked prefill is off, or a long prompt "
            "could never be scheduled."
        )
    threshold = scheduler_config.long_prefill_token_threshold
    if threshold < 0 or (threshold > 0 and not is_chunked):
        raise ValueError(
            f"long_prefill_token_threshold must be 0 (no cap) or, with chunked prefill on, "
            f"at least 1; got {threshold} with enable_chunked_prefill={is_chunked}."
        )
    num_blocks = kv_cache_config.num_blocks
    num_request_blocks = kv_cache_config.max_num_blocks_per_request(max_model_len, max_num_batched_tokens)
    if num_blocks - 1 < num_request_blocks:
        raise ValueError(
            f"num_gpu_blocks={num_blocks} holds {(num_blocks - 1) * kv_cache_config.block_size} tokens "
            f"(block 0 is reserved), {num_blocks - 1} blocks, fewer than the {num_request_blocks} blocks "
            f"one request of max_model_len={max_model_len} tokens may hold at once: a request that "
            "long could never run."
        )
    if kv_cache_config.has_state_layers and kv_cache_config.num_state_slots - 1 < scheduler_config.max_num_seqs:
        raise ValueError(
            f"num_state_slots={kv_cache_config.num_state_slots} must be at least max_num_seqs + 1 "
            f"({scheduler_config.max_num_seqs + 1}): every running request holds a state slot (slot 0 is reserved)."
        )


@dataclasses.dataclass
class _StepPlan:
    """What one `schedule()` call has decided so far."""

    token_budget: int
    num_output_placeholders: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The scheduler's `num_output_placeholders`: a request's drafts come after them."""
    num_scheduled_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    new_blocks: dict[str, KVCacheBlocks] = dataclasses.field(default_factory=dict)
    scheduled_running_reqs: list[Request] = dataclasses.field(default_factory=list)
    scheduled_new_reqs: list[Request] = dataclasses.field(default_factory=list)
    scheduled_resumed_reqs: list[Request] = dataclasses.field(default_factory=list)
    preempted_reqs: list[Request] = dataclasses.field(default_factory=list)
    spec_decode_tokens: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def schedule(self, request: Request, num_new_tokens: int, new_blocks: KVCacheBlocks) -> None:
        """Schedules `num_new_tokens` of the request; those past its tokens (and its tokens in
        flight) are its first drafts."""
        request_id = request.request_id
        self.num_scheduled_tokens[request_id] = num_new_tokens
        self.new_blocks[request_id] = new_blocks
        self.token_budget -= num_new_tokens
        if request.spec_token_ids:
            num_known_tokens = request.num_tokens + self.num_output_placeholders.get(request_id, 0)
            num_drafts = request.num_computed_tokens + num_new_tokens - num_known_tokens
            if num_drafts > 0:
                self.spec_decode_tokens[request_id] = request.spec_token_ids[:num_drafts]
            request.spec_token_ids = []

    def unschedule_running(self, request: Request) -> None:
        self.token_budget += self.num_scheduled_tokens.pop(request.request_id)
        del self.new_blocks[request.request_id]
        self.spec_decode_tokens.pop(request.request_id, None)
        self.scheduled_running_reqs.remove(request)


class Scheduler:
    """Spends one token budget per step over running requests, then waiting ones.

    There are no prefill or decode phases: every request advances `num_computed_tokens`
    toward `num_tokens`, and that one rule covers prompts (whole or in chunks), prefix-cache
    hits and decoding. When the pool runs out of blocks, the lowest-priority running request
    is preempted: its blocks are freed and it is recomputed later from its tokens, outputs
    included. `AsyncScheduler` extends this to plan a step before the previous one's tokens
    are known.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        kv_cache_config: KVCacheConfig,
        structured_output_manager: "StructuredOutputManager | None" = None,
    ) -> None:
        """`kv_cache_config`: the pool's size and the layer groups, as the worker built them.
        `structured_output_manager`: the grammars of constrained requests (None: the
        scheduler takes none)."""
        _verify_config(scheduler_config, kv_cache_config)
        self.structured_output_manager = structured_output_manager
        self._grammar_failures: set[str] = set()
        """Waiting requests whose grammar did not compile: the next update fails them."""
        self._num_constrained_reqs = 0
        """Unfinished requests with a grammar: with none, a step spends nothing on grammars."""
        max_model_len = scheduler_config.max_model_len
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = scheduler_config.long_prefill_token_threshold
        self.waiting = create_request_queue(scheduler_config.scheduling_policy)
        self.policy = SchedulingPolicy(scheduler_config.scheduling_policy)
        self.kv_cache_config = kv_cache_config
        self.kv_cache_manager = KVCacheManager(
            block_size=kv_cache_config.block_size,
            num_gpu_blocks=kv_cache_config.num_blocks,
            max_model_len=max_model_len,
            kv_cache_groups=kv_cache_config.kv_cache_groups,
            enable_caching=cache_config.enable_prefix_caching,
            hash_algo=cache_config.prefix_caching_hash_algo,
            num_lookahead_tokens=scheduler_config.num_lookahead_tokens,
            num_unverified_tokens=scheduler_config.num_spec_tokens if scheduler_config.async_scheduling else 0,
            num_state_slots=kv_cache_config.num_state_slots,
        )
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.num_output_placeholders: dict[str, int] = {}
        """Per request, tokens sampled by steps in flight; absent means none. Only the
        `AsyncScheduler` has any: a synchronous step's tokens are back before the next is planned."""
        self.finished_req_ids: set[str] = set()
        """Finished or aborted since the last `schedule()`: the runner must drop them."""
        self._finished_req_ids_to_report: set[str] = set()
        """Finished or aborted since the last `update_from_output()`."""
        self.num_preemptions = 0
        """Preemptions since start, for metrics."""
        self.num_steps = 0
        """Steps that computed at least one token, since start."""
        self.num_scheduled_tokens = 0
        """Tokens scheduled since start."""
        self.spec_decoding_stats = SpecDecodingStats()
        """Drafts verified and tokens accepted since start (speculative decoding)."""
        self.num_spec_tokens = scheduler_config.num_spec_tokens
        self.spec_decode_metrics_level = scheduler_config.per_request_spec_decode_metrics
        """Past "none", every request counts its own verify steps (per_request_spec_decode_metrics)."""
        self._last_stats = self._make_totals()

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler.")
        if not 1 <= request.num_prompt_tokens <= self.max_model_len:
            raise ValueError(
                f"the prompt of request {request.request_id!r} has {request.num_prompt_tokens} "
                f"tokens; it must have 1 to max_model_len={self.max_model_len}."
            )
        if request.sampling_params.structured_outputs is not None:
            if self.structured_output_manager is None:
                raise ValueError(f"request {request.request_id!r} has structured_outputs; this scheduler takes none.")
            self.structured_output_manager.grammar_init(request)
            self._num_constrained_reqs += 1
        self.waiting.add_request(request)
        self.requests[request.request_id] = request
        if self.spec_decode_metrics_level != "none":
            request.spec_decode_metrics = RequestSpecDecodeMetrics.new(self.num_spec_tokens)
        request.record_event(EngineCoreEventType.QUEUED)

    def schedule(self) -> SchedulerOutput:
        plan = _StepPlan(self.max_num_scheduled_tokens, self.num_output_placeholders)
        self._schedule_running(plan)
        # A step that had to preempt is short of blocks: admitting more would thrash.
        if not plan.preempted_reqs:
            self._schedule_waiting(plan)
        scheduler_output = self._make_scheduler_output(plan)
        self._update_after_schedule(scheduler_output)
        return scheduler_output

    def _num_new_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens the request would compute this step, before the token budget caps them.

        Positions stay below max_model_len (a request reaching it is finished anyway), and
        `long_prefill_token_threshold` caps a long prompt's chunk so that it cannot take the
        whole budget from the requests behind it.
        """
        num_new_tokens = min(
            request.num_tokens_with_spec - num_computed_tokens, self.max_model_len - num_computed_tokens
        )
        if 0 < self.long_prefill_token_threshold < num_new_tokens:
            return self.long_prefill_token_threshold
        return num_new_tokens

    def _schedule_running(self, plan: _StepPlan) -> None:
        manager = self.kv_cache_manager
        req_index = 0
        while req_index < len(self.running) and plan.token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = self._num_new_tokens(request, request.num_computed_tokens)
            if num_new_tokens <= 0:
                # Every token it has is computed or in flight: nothing to do until they land.
                req_index += 1
                continue
            if num_new_tokens > plan.token_budget:
                num_new_tokens = plan.token_budget
            new_blocks = manager.allocate_slots(request, num_new_tokens)
            if new_blocks is None:
                req_index, new_blocks = self._preempt_until_allocated(request, num_new_tokens, req_index, plan)
                if new_blocks is None:
                    return
            plan.schedule(request, num_new_tokens, new_blocks)
            plan.scheduled_running_reqs.append(request)
            req_index += 1

    def _preempt_until_allocated(
        self, request: Request, num_new_tokens: int, req_index: int, plan: _StepPlan
    ) -> tuple[int, KVCacheBlocks | None]:
        """Preempt running requests until the request's slots fit; its new index in running.

        None when the request had to preempt itself: nothing more can be scheduled this step.
        """
        new_blocks = None
        while new_blocks is None:
            victim_index = self._preemption_victim_index()
            victim = self.running.pop(victim_index)
            self._preempt(victim, plan)
            if victim is request:
                return req_index, None
            if victim_index < req_index:
                req_index -= 1
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
        return req_index, new_blocks

    def _preemption_victim_index(self) -> int:
        """The most recently admitted request, or under PRIORITY the max (priority, arrival)."""
        if self.policy is SchedulingPolicy.FCFS:
            return len(self.running) - 1
        return max(
            range(len(self.running)),
            key=lambda i: (self.running[i].priority, self.running[i].arrival_time, i),
        )

    def _preempt(self, request: Request, plan: _StepPlan) -> None:
        """Free the request's blocks and send it to the front of the queue, to be recomputed."""
        if request.request_id in plan.num_scheduled_tokens:
            plan.unschedule_running(request)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.record_event(EngineCoreEventType.PREEMPTED)
        self.waiting.prepend_request(request)
        plan.preempted_reqs.append(request)

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        skipped: list[Request] = []
        self._admit_waiting(plan, skipped)
        # Requests whose grammar is still compiling keep their place at the front.
        for request in reversed(skipped):
            self.waiting.prepend_request(request)

    def _admit_waiting(self, plan: _StepPlan, skipped: list[Request]) -> None:
        manager = self.kv_cache_manager
        # Without LoRA (max_loras 0) no request has an adapter: no walk over the running ones.
        running_loras = (
            {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
            if self.scheduler_config.max_loras
            else set()
        )
        while self.waiting and plan.token_budget > 0:
            if len(self.running) == self.max_num_running_reqs:
                break
            request = self.waiting.peek_request()
            is_waiting_for_grammar = request.structured_output_request is not None and not self._is_grammar_ready(
                request
            )
            if is_waiting_for_grammar or not self._lora_fits(request, running_loras):
                skipped.append(self.waiting.pop_request())
                continue
            computed_blocks, num_computed_tokens = manager.get_computed_blocks(request)
            num_new_tokens = self._num_new_tokens(request, num_computed_tokens)
            if num_new_tokens <= 0:
                break
            if num_new_tokens > plan.token_budget:
                if not self.scheduler_config.enable_chunked_prefill:
                    break
                num_new_tokens = plan.token_budget
            new_blocks = manager.allocate_slots(request, num_new_tokens, num_computed_tokens, computed_blocks)
            if new_blocks is None:
                break
            self.waiting.pop_request()
            self._admit(request, num_computed_tokens, plan)
            plan.schedule(request, num_new_tokens, new_blocks)
            if request.lora_request is not None:
                running_loras.add(request.lora_request.lora_int_id)

    def _lora_fits(self, request: Request, running_loras: set[int]) -> bool:
        """Whether running `request` keeps the running requests' distinct LoRA adapters within
        `max_loras` (the device's slots); one that does not waits, keeping its place."""
        lora = request.lora_request
        if lora is None or lora.lora_int_id in running_loras:
            return True
        return len(running_loras) < self.scheduler_config.max_loras

    def _is_grammar_ready(self, request: Request) -> bool:
        """Whether the request's grammar compiled; one that failed is failed by the next update."""
        if not self.structured_output_manager.is_ready(request):
            return False
        if self.structured_output_manager.compile_error(request) is None:
            return True
        self._grammar_failures.add(request.request_id)
        return False

    def _admit(self, request: Request, num_computed_tokens: int, plan: _StepPlan) -> None:
        self.running.append(request)
        if request.status is RequestStatus.PREEMPTED:
            plan.scheduled_resumed_reqs.append(request)
        else:
            plan.scheduled_new_reqs.append(request)
        request.status = RequestStatus.RUNNING
        request.record_event(EngineCoreEventType.SCHEDULED)
        request.num_computed_tokens = num_computed_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_computed_tokens

    def _make_scheduler_output(self, plan: _StepPlan) -> SchedulerOutput:
        """The step as a diff; token counts are taken before this step's tokens are added.

        New requests carry all their block ids. A running request carries only the blocks
        added this step (None when there are none); a resumed one carries all its blocks,
        which replace the ones it held before preemption.
        """
        manager = self.kv_cache_manager
        new_reqs_data = [
            NewRequestData(
                req_id=request.request_id,
                prompt_token_ids=request.prompt_token_ids,
                sampling_params=request.sampling_params,
                block_ids=manager.get_block_ids(request.request_id),
                num_computed_tokens=request.num_computed_tokens,
                eos_token_id=request.eos_token_id,
                lora_request=request.lora_request,
            )
            for request in plan.scheduled_new_reqs
        ]
        cached_reqs = plan.scheduled_running_reqs + plan.scheduled_resumed_reqs
        new_blocks = [plan.new_blocks[r.request_id] for r in plan.scheduled_running_reqs]
        cached_reqs_data = CachedRequestData(
            req_ids=[request.request_id for request in cached_reqs],
            resumed_from_preemption=[False] * len(new_blocks) + [True] * len(plan.scheduled_resumed_reqs),
            new_block_ids=[b.get_block_ids() if any(b.blocks) else None for b in new_blocks]
            + [manager.get_block_ids(r.request_id) for r in plan.scheduled_resumed_reqs],
            num_computed_tokens=[request.num_computed_tokens for request in cached_reqs],
        )
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached_reqs_data,
            num_scheduled_tokens=plan.num_scheduled_tokens,
            total_num_scheduled_tokens=sum(plan.num_scheduled_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            scheduled_spec_decode_tokens=plan.spec_decode_tokens,
        )

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        self._advance_computed_tokens(scheduler_output)
        self.finished_req_ids = set()
        if scheduler_output.total_num_scheduled_tokens:
            self.num_steps += 1
            self.num_scheduled_tokens += scheduler_output.total_num_scheduled_tokens

    def _advance_computed_tokens(self, scheduler_output: SchedulerOutput) -> None:
        """Counts the step's tokens as computed now, so that the next step can be scheduled
        before this one's tokens are back."""
        requests = self.requests
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            requests[req_id].num_computed_tokens += num_tokens

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        """Append the sampled tokens, finish requests that stop, and report what changed.

        A request in a partial prefill samples nothing and gets no output this step. A
        request that finished after this step was scheduled (aborted, or stopped by an
        earlier step under async scheduling) is gone, and its tokens are dropped.
        """
        outputs = self._fail_requests(model_runner_output.failed_req_ids | self._take_grammar_failures())
        stopped_running_ids, stopped_waiting = set(), []
        requests = self.requests
        req_id_to_index = model_runner_output.req_id_to_index
        sampled_token_ids = model_runner_output.sampled_token_ids
        # Most steps carry no logprobs: skip two lookups per request then.
        logprobs = model_runner_output.logprobs or None
        prompt_logprobs = model_runner_output.prompt_logprobs or None
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            if request is None:
                continue
            was_running = request.status is RequestStatus.RUNNING
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            new_token_ids, stopped = self._update_request_with_output(
                request, sampled_token_ids[req_id_to_index[req_id]], drafts
            )
            if not new_token_ids:
                continue
            if model_runner_output.spec_token_ids and not stopped and self._may_draft(request):
                request.spec_token_ids = model_runner_output.spec_token_ids[req_id_to_index[req_id]]
            if request.structured_output_request is not None and not stopped:
                stopped = self._advance_grammar(request, new_token_ids)
            finish_reason = request.get_finished_reason()
            if stopped:
                self._free_request(request)
                if was_running:
                    stopped_running_ids.add(req_id)
                else:
                    stopped_waiting.append(request)
            outputs.append(
                EngineCoreOutput(
                    req_id,
                    new_token_ids,
                    finish_reason,
                    request.stop_reason,
                    request.num_cached_tokens,
                    logprobs and logprobs.get(req_id),
                    prompt_logprobs and prompt_logprobs.get(req_id),
                    request.take_events(),
                    request.spec_decode_metrics if stopped else None,
                )
            )
        if stopped_running_ids:
            self.running = [r for r in self.running if r.request_id not in stopped_running_ids]
        if stopped_waiting:
            # Preempted while its last token was in flight (async scheduling only).
            self.waiting.remove_requests(stopped_waiting)
        finished_requests = self._finished_req_ids_to_report
        self._finished_req_ids_to_report = set()
        return EngineCoreOutputs(outputs=outputs, finished_requests=finished_requests)

    @staticmethod
    def _may_draft(request: Request) -> bool:
        """A constrained request takes drafts once its grammar has started: the think-end
        token is found only in the tokens a step keeps."""
        so_request = request.structured_output_request
        return so_request is None or so_request.reasoning_ended

    def _reject_drafts(self, request: Request, drafts: list[int], num_accepted: int) -> None:
        """The step computed all of the request's drafts; those after the first rejected one
        are not its tokens, so their KV is uncomputed again (their slots get overwritten)."""
        request.num_computed_tokens -= len(drafts) - num_accepted
        self._observe_drafts(request, len(drafts), num_accepted)

    def _observe_drafts(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """The counts go to the stats, and to the request's own metrics when it keeps them."""
        self.spec_decoding_stats = self.spec_decoding_stats.observe_draft(num_drafts, num_accepted)
        if request.spec_decode_metrics is not None:
            detailed = self.spec_decode_metrics_level == "detailed"
            request.spec_decode_metrics.observe(num_drafts, num_accepted, detailed)

    def _advance_grammar(self, request: Request, new_token_ids: list[int]) -> bool:
        """Advances the request's grammar; a grammar that ended stops the request."""
        if not self.structured_output_manager.accept_tokens(request, new_token_ids):
            return False
        request.status = RequestStatus.FINISHED_STOPPED
        return True

    def _take_grammar_failures(self) -> set[str]:
        if not self._grammar_failures:
            return set()
        failures, self._grammar_failures = self._grammar_failures, set()
        for req_id in failures:
            logger.error(
                "Request %s: its grammar did not compile: %s",
                req_id,
                self.structured_output_manager.compile_error(self.requests[req_id]),
            )
        return failures

    def has_structured_output_requests(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether a constrained request runs in the step (its mask needs its latest token)."""
        if not self._num_constrained_reqs:
            return False
        requests = self.requests
        return any(
            req_id in requests and requests[req_id].structured_output_request is not None
            for req_id in scheduler_output.num_scheduled_tokens
        )

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """Sets the step's grammar bitmask (one row per scheduled request, in the order of
        `num_scheduled_tokens`) when some scheduled request is constrained: called right
        before the step is dispatched, once every token its masks depend on is in."""
        if not self._num_constrained_reqs:
            return
        requests = [self.requests.get(req_id) for req_id in scheduler_output.num_scheduled_tokens]
        spec = scheduler_output.scheduled_spec_decode_tokens
        drafts = [spec.get(req_id, []) for req_id in scheduler_output.num_scheduled_tokens] if spec else None
        scheduler_output.grammar_bitmask = self.structured_output_manager.grammar_bitmask(requests, drafts)

    def _fail_requests(self, request_ids: set[str]) -> list[EngineCoreOutput]:
        """Finishes the requests the runner could not run, each with an ERROR output."""
        failed = [r for r in request_ids if r in self.requests]
        self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        return [EngineCoreOutput(r, [], FinishReason.ERROR) for r in failed]

    def _update_request_with_output(
        self, request: Request, sampled_token_ids: list[int], drafts: list[int] | None = None
    ) -> tuple[list[int], bool]:
        """The tokens kept (up to the first that stops the request) and whether it stopped.
        With `drafts`, the step kept those of them it returns but the last."""
        if drafts and sampled_token_ids:
            self._reject_drafts(request, drafts, len(sampled_token_ids) - 1)
        return append_until_stop(request, sampled_token_ids, self.max_model_len)

    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus) -> None:
        """Finish requests from outside (aborts) in any state: their blocks are freed at once.

        Unknown or already finished ids are ignored: a request may finish on its own while
        its abort is on the way.
        """
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finished_status must be a finished status, got {finished_status}.")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        requests = [self.requests[r] for r in dict.fromkeys(request_ids) if r in self.requests]
        running_ids = {r.request_id for r in requests if r.status is RequestStatus.RUNNING}
        if running_ids:
            self.running = [r for r in self.running if r.request_id not in running_ids]
        self.waiting.remove_requests(r for r in requests if r.request_id not in running_ids)
        for request in requests:
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        if request.structured_output_request is not None:
            self._num_constrained_reqs -= 1
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        self._finished_req_ids_to_report.add(request.request_id)
        del self.requests[request.request_id]

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        """Whether the runner still has to hear of finished requests (a step tells it)."""
        return len(self.finished_req_ids) > 0

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts, for metrics."""
        return len(self.running), len(self.waiting)

    def make_stats(self) -> SchedulerStats:
        """Gauges now, and counts since the previous call (or since start, the first time)."""
        totals = self._make_totals()
        stats = totals.since(self._last_stats)
        self._last_stats = totals
        return stats

    def _make_totals(self) -> SchedulerStats:
        prefix_cache_stats = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            num_steps=self.num_steps,
            num_scheduled_tokens=self.num_scheduled_tokens,
            num_preemptions=self.num_preemptions,
            num_prefix_queried_tokens=prefix_cache_stats.num_queried_tokens,
            num_prefix_hit_tokens=prefix_cache_stats.num_hit_tokens,
            spec_decoding_stats=self.spec_decoding_stats,
        )

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()
