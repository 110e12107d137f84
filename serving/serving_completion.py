"""OpenAIServingCompletion: `POST /v1/completions`, whole or streamed.

A request may hold several prompts (texts or token-id lists), each run as its own engine
request; choice `i * n + j` is completion j of prompt i. `echo` puts the prompt (and, with
`logprobs`, its prompt logprobs) in front of each choice.
"""

import time
from collections.abc import AsyncGenerator

from serving.errors import OpenAIError
from serving.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    UsageInfo,
    random_id,
)
from serving.serving_engine import OpenAIServing, merge_streams
from serving.sse import DONE_EVENT, EventStreamResponse, error_event, sse_event
from vjx.outputs import CompletionOutput, RequestOutput


def make_completion_logprobs(
    token_ids: list[int], logprobs: list, num_top: int, tokenizer, start_offset: int = 0
) -> CompletionLogProbs:
    """The legacy logprobs of some tokens: each position's chosen token (the first entry of
    its dict), its logprob, its `num_top` best candidates plus itself, and text offsets.
    A None position (the prompt's first token) has no logprob."""
    out = CompletionLogProbs()
    offset = start_offset
    for token_id, position in zip(token_ids, logprobs):
        if position is None:
            token = tokenizer.decode([token_id])
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            chosen = position[token_id] if token_id in position else next(iter(position.values()))
            token = chosen.decoded_token or ""
            top = {
                lp.decoded_token or "": lp.logprob
                for t, lp in position.items()
                if lp.rank is not None and lp.rank <= num_top
            }
            top.setdefault(token, chosen.logprob)
            out.token_logprobs.append(chosen.logprob)
            out.top_logprobs.append(top)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
    return out


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
            await self.tokenize(p, request.add_special_tokens, request.truncate_prompt_tokens)
            for p in self._split_prompts(request.prompt)
        ]
        prompt_logprobs = request.logprobs if request.echo and request.logprobs is not None else None
        if request.prompt_logprobs is not None:
            prompt_logprobs = max(request.prompt_logprobs, prompt_logprobs or 0)
        params = [
            self.to_sampling_params(
                request,
                self.check_lengths(len(ids), request.max_tokens, "max_tokens"),
                request.logprobs,
                prompt_logprobs,
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
            logprobs = make_completion_logprobs(token_ids, positions, request.logprobs, self.tokenizer, start_offset)
        return CompletionResponseChoice(
            index=index,
            text=prefix_text + completion.text,
            logprobs=logprobs,
            finish_reason=completion.finish_reason,
            stop_reason=completion.stop_reason,
        )

    async def _full(
        self, request: CompletionRequest, request_id: str, prompts: list[list[int]], streams
    ) -> CompletionResponse:
        finals: dict[int, RequestOutput] = {}
        async for prompt_index, output in merge_streams(streams):
            finals[prompt_index] = output
        choices = []
        for prompt_index in range(len(prompts)):
            output = finals[prompt_index]
            prefix = await self._echo_prefix(request, output)
            for completion in output.outputs:
                choices.append(
                    self._make_choice(request, prompt_index * request.n + completion.index, completion, prefix)
                )
        num_generated = sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
        return CompletionResponse(
            id=request_id,
            model=self.models.model_name,
            choices=choices,
            usage=UsageInfo.of(sum(len(p) for p in prompts), num_generated),
        )

    async def _stream(
        self, request: CompletionRequest, request_id: str, prompts: list[list[int]], streams
    ) -> AsyncGenerator[str, None]:
        """One event per choice per engine output; then the usage event when asked for."""
        created = int(time.time())
        offsets: dict[int, int] = {}
        num_generated = 0
        try:
            async for prompt_index, output in merge_streams(streams):
                for completion in output.outputs:
                    index = prompt_index * request.n + completion.index
                    is_first = index not in offsets
                    prefix = await self._echo_prefix(request, output) if is_first else ("", [], None)
                    choice = self._make_choice(request, index, completion, prefix, offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + len(choice.text)
                    num_generated += len(completion.token_ids)
                    chunk = CompletionResponse(
                        id=request_id, created=created, model=self.models.model_name, choices=[choice]
                    )
                    yield sse_event(chunk.model_dump_json(exclude={"usage"}))
            if request.include_usage:
                usage = UsageInfo.of(sum(len(p) for p in prompts), num_generated)
                chunk = CompletionResponse(
                    id=request_id, created=created, model=self.models.model_name, choices=[], usage=usage
                )
                yield sse_event(chunk.model_dump_json())
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            yield error_event(e, request_id)
        yield DONE_EVENT
