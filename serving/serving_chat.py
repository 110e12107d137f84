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
from serving.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessageOut,
    ChatTokenLogprob,
    ChatTopLogprob,
    DeltaMessage,
    UsageInfo,
    random_id,
)
from serving.serving_engine import OpenAIServing, merge_streams
from serving.sse import DONE_EVENT, EventStreamResponse, error_event, sse_event
from vjx.outputs import CompletionOutput


def make_chat_logprobs(token_ids: list[int], logprobs: list, num_top: int) -> ChatChoiceLogprobs:
    """Each token's logprob and its `num_top` best candidates, in the chat format."""
    content = []
    for token_id, position in zip(token_ids, logprobs):
        chosen = position[token_id] if token_id in position else next(iter(position.values()))
        token = chosen.decoded_token or ""
        candidates = sorted(
            (lp for lp in position.values() if lp.rank is not None and lp.rank <= num_top), key=lambda lp: lp.rank
        )
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=chosen.logprob,
                bytes=list(token.encode("utf-8")),
                top_logprobs=[
                    ChatTopLogprob(
                        token=lp.decoded_token or "",
                        logprob=lp.logprob,
                        bytes=list((lp.decoded_token or "").encode("utf-8")),
                    )
                    for lp in candidates[:num_top]
                ],
            )
        )
    return ChatChoiceLogprobs(content=content)


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
        text = await self.render_chat(request.messages, request.add_generation_prompt, request.continue_final_message)
        prompt = await self.tokenize(text, request.add_special_tokens, request.truncate_prompt_tokens, "messages")
        if request.max_completion_tokens is not None:
            max_tokens = self.check_lengths(len(prompt), request.max_completion_tokens, "max_completion_tokens")
        else:
            max_tokens = self.check_lengths(len(prompt), request.max_tokens, "max_tokens")
        params = self.to_sampling_params(request, max_tokens, num_logprobs, request.prompt_logprobs)
        request_id = request.request_id or random_id("chatcmpl")
        streams = await self.add_requests(request, [prompt], [params], request_id)
        if request.stream:
            return EventStreamResponse(self._stream(request, request_id, len(prompt), streams), streams)
        return await self._full(request, request_id, len(prompt), streams)

    @staticmethod
    def _echo_text(request: ChatCompletionRequest) -> str:
        """What `echo` puts in front of each choice's content."""
        last = request.messages[-1]
        if not request.echo or (request.add_generation_prompt and last.role != "assistant"):
            return ""
        return to_text(last.content)

    def _logprobs(self, request: ChatCompletionRequest, completion: CompletionOutput) -> ChatChoiceLogprobs | None:
        if not request.logprobs:
            return None
        return make_chat_logprobs(
            list(completion.token_ids), list(completion.logprobs or []), request.top_logprobs or 0
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
                message=ChatMessageOut(content=echo + completion.text),
                logprobs=self._logprobs(request, completion),
                finish_reason=completion.finish_reason,
                stop_reason=completion.stop_reason,
            )
            for completion in final.outputs
        ]
        num_generated = sum(len(c.token_ids) for c in final.outputs)
        return ChatCompletionResponse(
            id=request_id,
            model=self.models.model_name,
            choices=choices,
            usage=UsageInfo.of(num_prompt_tokens, num_generated),
        )

    def _chunk(self, request_id: str, created: int, choice: ChatCompletionStreamChoice) -> str:
        chunk = ChatCompletionStreamResponse(
            id=request_id, created=created, model=self.models.model_name, choices=[choice]
        )
        return sse_event(chunk.model_dump_json(exclude={"usage"}))

    async def _stream(
        self, request: ChatCompletionRequest, request_id: str, num_prompt_tokens: int, streams
    ) -> AsyncGenerator[str, None]:
        created = int(time.time())
        echo = self._echo_text(request)
        for index in range(request.n):
            delta = DeltaMessage(role="assistant", content=echo)
            yield self._chunk(request_id, created, ChatCompletionStreamChoice(index=index, delta=delta))
        num_generated = 0
        try:
            async for _, output in merge_streams(streams):
                for completion in output.outputs:
                    num_generated += len(completion.token_ids)
                    choice = ChatCompletionStreamChoice(
                        index=completion.index,
                        delta=DeltaMessage(content=completion.text),
                        logprobs=self._logprobs(request, completion),
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                    )
                    yield self._chunk(request_id, created, choice)
            if request.include_usage:
                chunk = ChatCompletionStreamResponse(
                    id=request_id,
                    created=created,
                    model=self.models.model_name,
                    choices=[],
                    usage=UsageInfo.of(num_prompt_tokens, num_generated),
                )
                yield sse_event(chunk.model_dump_json())
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            yield error_event(e, request_id)
        yield DONE_EVENT
