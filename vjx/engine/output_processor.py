"""Turns EngineCore's token outputs into the `RequestOutput`s users see.

The front-end half after EngineCore: it detokenizes, finds stop strings (EngineCore stops on
what needs no text: EOS, stop token ids, lengths), turns logprobs rows into `Logprob` dicts,
gathers the children of an `n > 1` request into one output, and tells the engine which
requests a stop string finished, so EngineCore frees them. Given an `IterationStats`, it also
records what the step meant for the metrics (vjx.metrics).
"""

import dataclasses

from transformers import PreTrainedTokenizerBase

from vjx.engine.detokenizer import IncrementalDetokenizer
from vjx.engine.logprobs import LogprobsProcessor, TokenDecoder
from vjx.engine.messages import EngineCoreOutput, EngineCoreRequest, FinishReason
from vjx.engine.parallel_sampling import ParentRequest
from vjx.metrics.stats import IterationStats, RequestStateStats
from vjx.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from vjx.sampling_params import RequestOutputKind
from vjx.spec_decode.request_metrics import RequestSpecDecodeMetrics


@dataclasses.dataclass(frozen=True)
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]
    """Requests a stop string finished while EngineCore still runs them."""


class RequestState:
    """The front end's view of one unfinished request (a child, when it has a parent)."""

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        tokenizer: PreTrainedTokenizerBase,
        token_decoder: TokenDecoder,
        parent: ParentRequest | None = None,
        request_index: int = 0,
    ):
        self.request_id = request.request_id
        self.parent = parent
        self.request_index = request_index
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = request.sampling_params.output_kind
        self.detokenizer = IncrementalDetokenizer(tokenizer, request)
        self.logprobs_processor = LogprobsProcessor.from_new_request(token_decoder, request)
        self.num_cached_tokens = 0
        self._num_sent_tokens = 0
        self.max_tokens_param = request.sampling_params.max_tokens
        self.stats = RequestStateStats(arrival_time=request.arrival_time)
        self.spec_decode_metrics: RequestSpecDecodeMetrics | None = None
        """Arrives with EngineCore's finishing output (per_request_spec_decode_metrics)."""

    def update(self, output: EngineCoreOutput) -> tuple[FinishReason | None, int | str | None, bool]:
        """Applies one step's output; returns (finish reason, stop reason, whether a stop
        string finished a request EngineCore still runs)."""
        self.num_cached_tokens = output.num_cached_tokens
        if output.spec_decode_metrics is not None:
            self.spec_decode_metrics = output.spec_decode_metrics
        finish_reason, stop_reason = output.finish_reason, output.stop_reason
        detokenizer = self.detokenizer
        num_tokens_before = detokenizer.num_output_tokens
        stop_string = detokenizer.update(output.new_token_ids, finish_reason)
        if output.new_prompt_logprobs is not None:
            self.logprobs_processor.update_prompt_logprobs(output.new_prompt_logprobs)
        if output.new_logprobs is not None:
            num_kept = detokenizer.num_output_tokens - num_tokens_before
            self.logprobs_processor.update_sample_logprobs(output.new_logprobs, num_kept)
        if stop_string is None:
            return finish_reason, stop_reason, False
        return FinishReason.STOP, stop_string, finish_reason is None

    def make_completion_output(
        self, finish_reason: FinishReason | None, stop_reason: int | str | None
    ) -> CompletionOutput | None:
        """This request's completion after a step, or None when its output kind shows
        nothing yet. DELTA: only the tokens, text and logprobs not handed out before."""
        finished = finish_reason is not None
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        is_delta = self.output_kind == RequestOutputKind.DELTA
        start = self._num_sent_tokens if is_delta else 0
        token_ids = self.detokenizer.output_token_ids  # a copy already
        if start:
            token_ids = token_ids[start:]
        logprobs = self.logprobs_processor.logprobs
        if logprobs is not None:
            logprobs = logprobs[start:]
        if is_delta:
            self._num_sent_tokens += len(token_ids)
        return CompletionOutput(
            index=self.request_index,
            text=self.detokenizer.get_next_output_text(finished, is_delta),
            token_ids=token_ids,
            cumulative_logprob=self.logprobs_processor.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=str(finish_reason) if finished else None,
            stop_reason=stop_reason if finished else None,
            spec_decode_metrics=self.spec_decode_metrics if finished else None,
        )

    def get_prompt_logprobs(self) -> PromptLogprobs | None:
        """All prompt logprobs, or (DELTA) those not handed out before."""
        if self.output_kind == RequestOutputKind.DELTA:
            return self.logprobs_processor.pop_prompt_logprobs()
        return self.logprobs_processor.prompt_logprobs

    def make_request_output(self, completion: CompletionOutput) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion],
            finished=completion.finished(),
            prompt_logprobs=self.get_prompt_logprobs(),
            num_cached_tokens=self.num_cached_tokens,
        )


class OutputProcessor:
    """Keeps the state of every unfinished request and turns each step's outputs into
    `RequestOutput`s, in the order EngineCore gave them (a parent where its first child
    appears)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.token_decoder = TokenDecoder(tokenizer)
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}
        self._max_num_generation_tokens: dict[str, int] = {}
        """Per unfinished parent: the most tokens a finished child generated, for the metrics."""

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        parent: ParentRequest | None = None,
        request_index: int = 0,
    ) -> None:
        """Starts tracking a request (child `request_index` of `parent`, when given); its
        `sampling_params.output_kind` says what it shows."""
        self._check_unused(request.request_id)
        if parent is not None and self.parent_requests.get(parent.request_id) is not parent:
            self.add_parent_request(parent)
        state = RequestState(request, prompt, self.tokenizer, self.token_decoder, parent, request_index)
        self.request_states[request.request_id] = state

    def add_parent_request(self, parent: ParentRequest) -> None:
        """Starts tracking an `n > 1` request; its children are added next, one by one.
        Refuses before anything is tracked when the parent's or a child's id is in use."""
        for request_id in [parent.request_id, *parent.child_request_ids]:
            self._check_unused(request_id)
        self.parent_requests[parent.request_id] = parent

    def _check_unused(self, request_id: str) -> None:
        if request_id in self.request_states or request_id in self.parent_requests:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request.")

    def process_outputs(
        self,
        engine_core_outputs: list[EngineCoreOutput],
        engine_core_timestamp: float | None = None,
        iteration_stats: IterationStats | None = None,
    ) -> OutputProcessorOutput:
        """Applies one step's outputs; outputs of requests no longer tracked (aborted here
        while EngineCore was still running them) are dropped. With `iteration_stats`, records
        the step there; `engine_core_timestamp` is when its tokens were known (EngineCore's
        monotonic clock, as its events')."""
        pending: list[RequestOutput | ParentRequest] = []
        pending_parent_ids: set[str] = set()
        reqs_to_abort: list[str] = []
        for output in engine_core_outputs:
            state = self.request_states.get(output.request_id)
            if state is None:
                continue
            if iteration_stats is not None:
                iteration_stats.update_from_output(
                    output, engine_core_timestamp, len(state.prompt_token_ids), state.stats
                )
            if not output.new_token_ids and output.finish_reason is None:
                # Prompt logprobs of a chunk, if any, wait for the first token.
                state.logprobs_processor.update_prompt_logprobs(output.new_prompt_logprobs)
                continue
            finish_reason, stop_reason, needs_abort = state.update(output)
            if needs_abort:
                reqs_to_abort.append(output.request_id)
            if finish_reason is not None:
                if iteration_stats is not None:
                    self._record_finished(state, finish_reason, iteration_stats)
                self._forget(state)
            completion = state.make_completion_output(finish_reason, stop_reason)
            if completion is None:
                continue
            if state.parent is None:
                pending.append(state.make_request_output(completion))
                continue
            parent = state.parent
            prompt_logprobs = state.get_prompt_logprobs()
            parent.add_child_output(state.request_id, completion, prompt_logprobs, state.num_cached_tokens)
            if parent.request_id not in pending_parent_ids:
                pending_parent_ids.add(parent.request_id)
                pending.append(parent)
        if pending_parent_ids:
            pending = [p.make_request_output() if isinstance(p, ParentRequest) else p for p in pending]
            pending = [o for o in pending if o is not None]
        return OutputProcessorOutput(request_outputs=pending, reqs_to_abort=reqs_to_abort)

    def _record_finished(
        self, state: RequestState, finish_reason: FinishReason, iteration_stats: IterationStats
    ) -> None:
        """A request finished: its own figures, and its user request's once all `n` children are done."""
        num_generation_tokens = state.stats.num_generation_tokens
        iteration_stats.update_from_finished_request(
            finish_reason, len(state.prompt_token_ids), state.num_cached_tokens, state.max_tokens_param, state.stats
        )
        parent = state.parent
        if parent is None:
            iteration_stats.observe_user_request(1, num_generation_tokens)
            return
        most = max(self._max_num_generation_tokens.get(parent.request_id, 0), num_generation_tokens)
        self._max_num_generation_tokens[parent.request_id] = most
        if parent.unfinished_child_ids == {state.request_id}:
            iteration_stats.observe_user_request(parent.sampling_params.n, most)

    def _forget(self, state: RequestState) -> None:
        """Stops tracking a finished request, and its parent once every child is done."""
        del self.request_states[state.request_id]
        parent = state.parent
        if parent is not None:
            parent.finish_child(state.request_id)
            if parent.finished:
                self.parent_requests.pop(parent.request_id, None)
                self._max_num_generation_tokens.pop(parent.request_id, None)

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Stops tracking requests (a parent id stands for its children); returns the ids
        EngineCore must abort: those that were unfinished."""
        aborted = []
        for request_id in request_ids:
            parent = self.parent_requests.get(request_id)
            child_ids = parent.child_request_ids if parent is not None else [request_id]
            for child_id in child_ids:
                state = self.request_states.get(child_id)
                if state is not None:
                    self._forget(state)
                    aborted.append(child_id)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)
