"""OpenAIServingChat: `POST /v1/chat/completions`, whole or streamed.

The messages go through the chat template (the tokenizer's, or `--chat-template`) into one
prompt; `n` completions of it are the choices. A stream starts each choice with the
assistant role, then sends content deltas, then the finish reason. vLLM's `echo` puts the
last message's content in front of each choice's when that message is the reply's role
(the assistant's, or any with `add_generation_prompt=false`).
"""

import time
from collections.abc import AsyncGenerator

from serving.chat_utils import to_text
from serving.errors import OpenAIError
from serving.logprobs_format import make_chat_logprobs, to_prompt_logprobs
from serving.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessageOut,
    DeltaMessage,
    UsageInfo,
    random_id,
)
from serving.serving_engine import OpenAIServing, merge_streams
from serving.sse import DONE_EVENT, EventStreamResponse, error_event, sse_event
from vjx.outputs import CompletionOutput


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | EventStreamResponse:
        """The response, or for `stream=True` the server-sent events (ending in `[DONE]`)."""
        self.check_model(request)
        self.check_limits(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs to be true.", 400, "top_logprobs")
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        self.check_logprobs(num_logprobs, "top_logprobs")
        self.check_logprobs(request.prompt_logprobs, "prompt_logprobs")
        text = await self.render_chat(
            request.messages,
            request.add_generation_prompt,
            request.continue_final_message,
            request.chat_template,
            request.chat_template_kwargs,
        )
        prompt = await self.tokenize(text, request.add_special_tokens, request, "messages")
        if request.max_completion_tokens is not None:
            max_tokens = self.check_lengths(len(prompt), request.max_completion_tokens, "max_completion_tokens")
        else:
            max_tokens = self.check_lengths(len(prompt), request.max_tokens, "max_tokens")
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.top_logprobs
        params = self.make_params(request, max_tokens, num_logprobs, prompt_logprobs)
        request_id = request.request_id or random_id("chatcmpl")
        streams = await self.add_requests(request, [prompt], [params], request_id)
        if request.stream:
            return EventStreamResponse(self._stream(request, request_id, prompt, streams), streams)
        return await self._full(request, request_id, len(prompt), streams)

    @staticmethod
    def _role(request: ChatCompletionRequest) -> str:
        """The reply's role (vLLM's): the assistant's, or without a generation prompt the last
        message's."""
        return "assistant" if request.add_generation_prompt else request.messages[-1].role

    def _echo_text(self, request: ChatCompletionRequest) -> str:
        """What `echo` puts in front of each choice's content: the last message's, when it is
        the reply's role."""
        last = request.messages[-1]
        if not request.echo or last.role != self._role(request):
            return ""
        return to_text(last.content)

    def _logprobs(self, request: ChatCompletionRequest, completion: CompletionOutput) -> ChatChoiceLogprobs | None:
        if not request.logprobs:
            return None
        return make_chat_logprobs(
            list(completion.token_ids),
            list(completion.logprobs or []),
            request.top_logprobs or 0,
            request.return_tokens_as_token_ids,
        )

    async def _full(
        self, request: ChatCompletionRequest, request_id: str, num_prompt_tokens: int, streams
    ) -> ChatCompletionResponse:
        final = None
        async for _, output in merge_streams(streams):
            final = output
        echo = self._echo_text(request)
        choices = [
            ChatCompletionResponseChoice(
                index=completion.index,
                message=ChatMessageOut(role=self._role(request), content=echo + completion.text),
                logprobs=self._logprobs(request, completion),
                finish_reason=completion.finish_reason,
                stop_reason=completion.stop_reason,
                token_ids=list(completion.token_ids) if request.return_token_ids else None,
            )
            for completion in final.outputs
        ]
        num_generated = sum(len(c.token_ids) for c in final.outputs)
        return ChatCompletionResponse(
            id=request_id,
            model=self.models.model_name,
            choices=choices,
            usage=self.usage(num_prompt_tokens, num_generated, [final]),
            prompt_logprobs=to_prompt_logprobs(final.prompt_logprobs),
            prompt_token_ids=list(final.prompt_token_ids) if request.return_token_ids else None,
        )

    def _chunk(
        self, request_id: str, created: int, choice: ChatCompletionStreamChoice, **fields
    ) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(
            id=request_id, created=created, model=self.models.model_name, choices=[choice], **fields
        )

    def _first_chunks(
        self, request: ChatCompletionRequest, request_id: str, created: int, prompt: list[int]
    ) -> list[ChatCompletionStreamResponse]:
        """Each choice's first chunk: the role and the echo (and the prompt's ids, and the usage
        so far, when asked for)."""
        fields = {"prompt_token_ids": prompt if request.return_token_ids else None}
        if request.include_continuous_usage:
            fields["usage"] = UsageInfo.of(len(prompt), 0)
        delta = DeltaMessage(role=self._role(request), content=self._echo_text(request))
        return [
            self._chunk(request_id, created, ChatCompletionStreamChoice(index=index, delta=delta), **fields)
            for index in range(request.n)
        ]

    async def _stream(
        self, request: ChatCompletionRequest, request_id: str, prompt: list[int], streams
    ) -> AsyncGenerator[str, None]:
        created = int(time.time())
        for chunk in self._first_chunks(request, request_id, created, prompt):
            yield _event(chunk)
        num_generated = [0] * request.n
        final = None
        try:
            async for _, output in merge_streams(streams):
                final = output
                for completion in output.outputs:
                    num_generated[completion.index] += len(completion.token_ids)
                    choice = ChatCompletionStreamChoice(
                        index=completion.index,
                        delta=DeltaMessage(content=completion.text),
                        logprobs=self._logprobs(request, completion),
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                        token_ids=list(completion.token_ids) if request.return_token_ids else None,
                    )
                    chunk = self._chunk(request_id, created, choice)
                    if request.include_continuous_usage:
                        chunk.usage = UsageInfo.of(len(prompt), num_generated[completion.index])
                    yield _event(chunk)
            if request.include_usage:
                chunk = ChatCompletionStreamResponse(
                    id=request_id,
                    created=created,
                    model=self.models.model_name,
                    choices=[],
                    usage=self.usage(len(prompt), sum(num_generated), [final] if final else []),
                )
                yield sse_event(chunk.model_dump_json())
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            yield error_event(e, request_id)
        yield DONE_EVENT


def _event(chunk: ChatCompletionStreamResponse) -> str:
    """A chunk's event; the usage only when the chunk carries it."""
    return sse_event(chunk.model_dump_json(exclude=None if chunk.usage is not None else {"usage"}))
