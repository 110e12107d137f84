"""OpenAIServingCompletion: `POST /v1/completions`, whole or streamed.

A request may hold several prompts (texts or token-id lists), each run as its own engine
request (or beam search); choice `i * n + j` is completion j of prompt i. `echo` puts the
prompt (and, with `logprobs`, its prompt logprobs) in front of each choice; with
`max_tokens=0` a choice is the prompt alone (scoring: the engine runs one token, dropped).
"""

import dataclasses
import time
from collections.abc import AsyncGenerator

from serving.errors import OpenAIError
from serving.logprobs_format import make_completion_logprobs, to_prompt_logprobs
from serving.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    UsageInfo,
    random_id,
)
from serving.serving_engine import OpenAIServing, merge_streams, per_request_metrics
from serving.sse import DONE_EVENT, EventStreamResponse, error_event, sse_event
from vjx.outputs import CompletionOutput, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: CompletionRequest) -> CompletionResponse | EventStreamResponse:
        """The response, or for `stream=True` the server-sent events (ending in `[DONE]`)."""
        self.check_model(request)
        self.check_limits(request)
        if request.suffix is not None:
            raise OpenAIError("suffix is not supported.", 400, "suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise OpenAIError(
                f"best_of must equal n={request.n} (best-of sampling is not supported), got {request.best_of}.",
                400,
                "best_of",
            )
        self.check_logprobs(request.logprobs, "logprobs")
        self.check_logprobs(request.prompt_logprobs, "prompt_logprobs")
        prompts = [
            await self.tokenize(p, request.add_special_tokens, request) for p in self._split_prompts(request.prompt)
        ]
        prompt_logprobs = request.logprobs if request.echo and request.logprobs is not None else None
        if request.prompt_logprobs is not None:
            prompt_logprobs = max(request.prompt_logprobs, prompt_logprobs or 0)
        max_tokens = 1 if _is_scoring(request) else request.max_tokens
        params = [
            self.make_params(
                request, self.check_lengths(len(ids), max_tokens, "max_tokens"), request.logprobs, prompt_logprobs
            )
            for ids in prompts
        ]
        request_id = request.request_id or random_id("cmpl")
        streams = await self.add_requests(request, prompts, params, request_id)
        if request.stream:
            return EventStreamResponse(self._stream(request, request_id, prompts, streams), streams)
        return await self._full(request, request_id, prompts, streams)

    def _split_prompts(self, prompt) -> list:
        """The request's prompts, at most --max-prompts-per-request of them."""
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        if not prompt:
            raise OpenAIError("prompt must not be empty.", 400, "prompt")
        limit = self.server_args.max_prompts_per_request
        if len(prompt) > limit:
            raise OpenAIError(
                f"prompt may hold at most {limit} prompts (the server's limit), got {len(prompt)}.", 400, "prompt"
            )
        return list(prompt)

    async def _echo_prefix(
        self, request: CompletionRequest, output: RequestOutput
    ) -> tuple[str, list[int], list | None]:
        """What echo puts in front of a choice: the prompt's text, ids and logprobs."""
        if not request.echo:
            return "", [], None
        text = output.prompt
        if text is None:
            text = await self.tokenizer_pool.decode(output.prompt_token_ids)
        return text, list(output.prompt_token_ids), output.prompt_logprobs

    def _make_choice(
        self,
        request: CompletionRequest,
        index: int,
        completion: CompletionOutput,
        prefix: tuple[str, list[int], list | None],
        start_offset: int = 0,
    ) -> CompletionResponseChoice:
        prefix_text, prefix_ids, prefix_logprobs = prefix
        logprobs = None
        if request.logprobs is not None:
            token_ids = prefix_ids + list(completion.token_ids)
            positions = (list(prefix_logprobs or [None] * len(prefix_ids)) if prefix_ids else []) + list(
                completion.logprobs or []
            )
            logprobs = make_completion_logprobs(
                token_ids, positions, request.logprobs, self.tokenizer, start_offset, request.return_tokens_as_token_ids
            )
        return CompletionResponseChoice(
            index=index,
            text=prefix_text + completion.text,
            logprobs=logprobs,
            finish_reason=completion.finish_reason,
            stop_reason=completion.stop_reason,
            token_ids=list(completion.token_ids) if request.return_token_ids else None,
        )

    async def _full(
        self, request: CompletionRequest, request_id: str, prompts: list[list[int]], streams
    ) -> CompletionResponse:
        finals: dict[int, RequestOutput] = {}
        async for prompt_index, output in merge_streams(streams):
            finals[prompt_index] = _generated(request, output)
        choices = []
        for prompt_index in range(len(prompts)):
            output = finals[prompt_index]
            prefix = await self._echo_prefix(request, output)
            for completion in output.outputs:
                choice = self._make_choice(request, prompt_index * request.n + completion.index, completion, prefix)
                choice.prompt_logprobs = to_prompt_logprobs(output.prompt_logprobs)
                if request.return_token_ids:
                    choice.prompt_token_ids = list(output.prompt_token_ids)
                choices.append(choice)
        num_generated = sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
        return CompletionResponse(
            id=request_id,
            model=self.models.response_name(request.model),
            choices=choices,
            usage=self.usage(sum(len(p) for p in prompts), num_generated, list(finals.values())),
            metrics=per_request_metrics(list(finals.values()), request.n),
        )

    async def _stream(
        self, request: CompletionRequest, request_id: str, prompts: list[list[int]], streams
    ) -> AsyncGenerator[str, None]:
        """One event per choice per engine output (its first with the prompt's ids under
        `return_token_ids`, each with the usage so far under `continuous_usage_stats`); then
        the usage event (with the per-request metrics) when asked for."""
        created = int(time.time())
        offsets: dict[int, int] = {}
        num_generated: dict[int, int] = {}
        first_outputs: dict[int, RequestOutput] = {}
        last_outputs: dict[int, RequestOutput] = {}
        try:
            async for prompt_index, output in merge_streams(streams):
                output = _generated(request, output)
                first_outputs.setdefault(prompt_index, output)
                last_outputs[prompt_index] = output
                for completion in output.outputs:
                    index = prompt_index * request.n + completion.index
                    is_first = index not in offsets
                    prefix = await self._echo_prefix(request, output) if is_first else ("", [], None)
                    choice = self._make_choice(request, index, completion, prefix, offsets.get(index, 0))
                    if is_first and request.return_token_ids:
                        choice.prompt_token_ids = list(output.prompt_token_ids)
                    offsets[index] = offsets.get(index, 0) + len(choice.text)
                    num_generated[index] = num_generated.get(index, 0) + len(completion.token_ids)
                    chunk = CompletionResponse(
                        id=request_id, created=created, model=self.models.response_name(request.model), choices=[choice]
                    )
                    if request.include_continuous_usage:
                        chunk.usage = UsageInfo.of(len(prompts[prompt_index]), num_generated[index])
                    yield sse_event(chunk.model_dump_json(exclude=_absent(chunk)))
            if request.include_usage:
                usage = self.usage(
                    sum(len(p) for p in prompts), sum(num_generated.values()), list(first_outputs.values())
                )
                chunk = CompletionResponse(
                    id=request_id,
                    created=created,
                    model=self.models.response_name(request.model),
                    choices=[],
                    usage=usage,
                    metrics=per_request_metrics(list(last_outputs.values()), request.n),
                )
                yield sse_event(chunk.model_dump_json(exclude=_absent(chunk)))
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            yield error_event(e, request_id)
        yield DONE_EVENT


def _absent(chunk: CompletionResponse) -> dict:
    """What a streamed chunk leaves out: the usage and the metrics when it has none, and a
    choice's prompt logprobs (a stream never sends them)."""
    absent: dict = {name: True for name in ("usage", "metrics") if getattr(chunk, name) is None}
    if chunk.choices:
        absent["choices"] = {0: {"prompt_logprobs"}}
    return absent


def _is_scoring(request: CompletionRequest) -> bool:
    """`echo` with `max_tokens=0`: the prompt's logprobs, no completion."""
    return request.echo and request.max_tokens == 0


def _generated(request: CompletionRequest, output: RequestOutput) -> RequestOutput:
    """The output as the client sees it: a scoring request's completions hold no tokens."""
    if not _is_scoring(request):
        return output
    empty = [
        dataclasses.replace(c, text="", token_ids=[], logprobs=[], cumulative_logprob=None) for c in output.outputs
    ]
    return dataclasses.replace(output, outputs=empty)
