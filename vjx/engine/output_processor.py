"""Turns EngineCore's token outputs into the `RequestOutput`s users see.

The front-end half after EngineCore: it detokenizes, finds stop strings (EngineCore stops on
what needs no text: EOS, stop token ids, lengths) and tells the engine which requests a stop
string finished, so EngineCore frees them.
"""

import dataclasses

from transformers import PreTrainedTokenizerBase

from vjx.engine.detokenizer import IncrementalDetokenizer
from vjx.engine.messages import EngineCoreOutput, EngineCoreRequest, FinishReason
from vjx.outputs import CompletionOutput, RequestOutput
from vjx.sampling_params import RequestOutputKind


@dataclasses.dataclass(frozen=True)
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]
    """Requests a stop string finished while EngineCore still runs them."""


class RequestState:
    """The front end's view of one unfinished request."""

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        tokenizer: PreTrainedTokenizerBase,
    ):
        self.request_id = request.request_id
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = request.sampling_params.output_kind
        self.detokenizer = IncrementalDetokenizer(tokenizer, request)
        self.num_cached_tokens = 0
        self._num_sent_tokens = 0

    def make_request_output(
        self, finish_reason: FinishReason | None, stop_reason: int | str | None
    ) -> RequestOutput | None:
        """The output to hand out after a step, or None when this kind shows nothing yet."""
        finished = finish_reason is not None
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        is_delta = self.output_kind == RequestOutputKind.DELTA
        token_ids = self.detokenizer.output_token_ids
        if is_delta:
            token_ids = token_ids[self._num_sent_tokens :]
            self._num_sent_tokens += len(token_ids)
        completion = CompletionOutput(
            index=0,
            text=self.detokenizer.get_next_output_text(finished, is_delta),
            token_ids=token_ids,
            finish_reason=str(finish_reason) if finished else None,
            stop_reason=stop_reason if finished else None,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            num_cached_tokens=self.num_cached_tokens,
        )


class OutputProcessor:
    """Keeps the state of every unfinished request and turns each step's outputs into
    `RequestOutput`s, in the order EngineCore gave them."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request: EngineCoreRequest, prompt: str | None) -> None:
        """Starts tracking a request; its `sampling_params.output_kind` says what it shows."""
        if request.request_id in self.request_states:
            raise ValueError(f"request_id {request.request_id!r} is already in use by an unfinished request.")
        self.request_states[request.request_id] = RequestState(request, prompt, self.tokenizer)

    def process_outputs(self, engine_core_outputs: list[EngineCoreOutput]) -> OutputProcessorOutput:
        """Applies one step's outputs; outputs of requests no longer tracked (aborted here
        while EngineCore was still running them) are dropped."""
        request_outputs: list[RequestOutput] = []
        reqs_to_abort: list[str] = []
        for output in engine_core_outputs:
            state = self.request_states.get(output.request_id)
            if state is None:
                continue
            if not output.new_token_ids and not output.finished:
                continue
            finish_reason, stop_reason = output.finish_reason, output.stop_reason
            state.num_cached_tokens = output.num_cached_tokens
            stop_string = state.detokenizer.update(output.new_token_ids, finish_reason)
            if stop_string is not None:
                if finish_reason is None:
                    reqs_to_abort.append(output.request_id)
                finish_reason, stop_reason = FinishReason.STOP, stop_string
            request_output = state.make_request_output(finish_reason, stop_reason)
            if request_output is not None:
                request_outputs.append(request_output)
            if finish_reason is not None:
                del self.request_states[output.request_id]
        return OutputProcessorOutput(request_outputs=request_outputs, reqs_to_abort=reqs_to_abort)

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Stops tracking requests; returns those that were unfinished, for EngineCore to abort."""
        aborted = []
        for request_id in request_ids:
            if self.request_states.pop(request_id, None) is not None:
                aborted.append(request_id)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)
