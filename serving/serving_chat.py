"""OpenAIServingChat: `POST /v1/chat/completions`, whole or streamed.

The messages go through the chat template (the tokenizer's, or `--chat-template`) into one
prompt; `n` completions of it are the choices. A stream starts each choice with the
assistant role, then sends content deltas, then the finish reason. vLLM's `echo` puts the
last message's content in front of each choice's when that message is the reply's role
(the assistant's, or any with `add_generation_prompt=false`).

With a reasoning parser or tools, each choice's text goes through a `Parser` (serving/
parser.py): replies carry `reasoning` and `tool_calls`, streams send their deltas. A forced
tool choice ("required", a named function) puts its JSON grammar on the request.
"""

import dataclasses
import time
from collections.abc import AsyncGenerator

from serving.chat_utils import to_text
from serving.errors import OpenAIError
from serving.logprobs_format import make_chat_logprobs, to_prompt_logprobs
from serving.parser import Parser, ParserManager
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
from serving.serving_engine import OpenAIServing, merge_streams, per_request_metrics
from serving.sse import DONE_EVENT, EventStreamResponse, error_event, sse_event
from vjx.outputs import CompletionOutput
from vjx.sampling_params import SamplingParams


class OpenAIServingChat(OpenAIServing):
    def __init__(self, *args, parsers: ParserManager | None = None, **kwargs):
        """`parsers`: the server's reasoning and tool parsers (None: none)."""
        super().__init__(*args, **kwargs)
        self.parsers = parsers or ParserManager(self.tokenizer)

    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | EventStreamResponse:
        """The response, or for `stream=True` the server-sent events (ending in `[DONE]`)."""
        self.check_model(request)
        self.check_limits(request)
        self.parsers.check_request(request)
        request = self.parsers.adjust_request(request)
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
            request.tools,
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
        structured_outputs = self.parsers.structured_outputs(request)
        if structured_outputs is not None and isinstance(params, SamplingParams):
            params = dataclasses.replace(params, structured_outputs=structured_outputs)
        request_id = request.request_id or random_id("chatcmpl")
        streams = await self.add_requests(request, [prompt], [params], request_id)
        if request.stream:
            return EventStreamResponse(self._stream(request, request_id, prompt, streams), streams)
        return await self._full(request, request_id, prompt, streams)

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
        self, request: ChatCompletionRequest, request_id: str, prompt: list[int], streams
    ) -> ChatCompletionResponse:
        final = None
        async for _, output in merge_streams(streams):
            final = output
        choices = [self._choice(request, completion, prompt) for completion in final.outputs]
        num_generated = sum(len(c.token_ids) for c in final.outputs)
        return ChatCompletionResponse(
            id=request_id,
            model=self.models.response_name(request.model),
            choices=choices,
            usage=self.usage(len(prompt), num_generated, [final]),
            prompt_logprobs=to_prompt_logprobs(final.prompt_logprobs),
            prompt_token_ids=list(final.prompt_token_ids) if request.return_token_ids else None,
            metrics=per_request_metrics([final], request.n),
        )

    def _choice(
        self, request: ChatCompletionRequest, completion: CompletionOutput, prompt: list[int]
    ) -> ChatCompletionResponseChoice:
        message = ChatMessageOut(role=self._role(request), content=completion.text)
        finish_reason = completion.finish_reason
        parser = self._parser(request, prompt)
        if parser is not None:
            parsed = parser.parse(completion.text)
            # vLLM's: a forced tool choice's reply has "" for content, not null.
            content = (parsed.content or "") if parser.is_forced else parsed.content
            message = ChatMessageOut(
                role=message.role, content=content, reasoning=parsed.reasoning, tool_calls=parsed.tool_calls
            )
            choice = request.effective_tool_choice
            # OpenAI's: "tool_calls" when "auto" called tools or "required" ended normally.
            if (choice == "auto" and parsed.tool_calls) or (choice == "required" and finish_reason == "stop"):
                finish_reason = "tool_calls"
        echo = self._echo_text(request)
        if echo:
            message.content = echo + (message.content or "")
        return ChatCompletionResponseChoice(
            index=completion.index,
            message=message,
            logprobs=self._logprobs(request, completion),
            finish_reason=finish_reason,
            stop_reason=completion.stop_reason,
            token_ids=list(completion.token_ids) if request.return_token_ids else None,
        )

    def _parser(self, request: ChatCompletionRequest, prompt: list[int]) -> Parser | None:
        """A choice's parser (parsers keep state: one per choice), None when none parses."""
        parser = self.parsers.get_parser(request)
        if parser is not None:
            parser.set_prompt_token_ids(prompt)
        return parser

    def _stream_choice(
        self, request: ChatCompletionRequest, completion: CompletionOutput, parser: Parser | None
    ) -> ChatCompletionStreamChoice | None:
        delta = _stream_delta(completion, parser)
        if delta is None:
            return None
        finish_reason = completion.finish_reason
        # vLLM's: a stream that sent tool calls and stopped normally ends in "tool_calls",
        # except for a named function.
        named = not isinstance(request.effective_tool_choice, str)
        if finish_reason == "stop" and parser is not None and parser.num_streamed_tool_calls and not named:
            finish_reason = "tool_calls"
        return ChatCompletionStreamChoice(
            index=completion.index,
            delta=delta,
            logprobs=self._logprobs(request, completion),
            finish_reason=finish_reason,
            stop_reason=completion.stop_reason,
            token_ids=list(completion.token_ids) if request.return_token_ids else None,
        )

    def _chunk(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        created: int,
        choice: ChatCompletionStreamChoice,
        **fields,
    ) -> ChatCompletionStreamResponse:
        model = self.models.response_name(request.model)
        return ChatCompletionStreamResponse(id=request_id, created=created, model=model, choices=[choice], **fields)

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
            self._chunk(request, request_id, created, ChatCompletionStreamChoice(index=index, delta=delta), **fields)
            for index in range(request.n)
        ]

    async def _stream(
        self, request: ChatCompletionRequest, request_id: str, prompt: list[int], streams
    ) -> AsyncGenerator[str, None]:
        created = int(time.time())
        for chunk in self._first_chunks(request, request_id, created, prompt):
            yield _event(chunk)
        num_generated = [0] * request.n
        parsers = [self._parser(request, prompt) for _ in range(request.n)]
        final = None
        try:
            async for _, output in merge_streams(streams):
                final = output
                for completion in output.outputs:
                    num_generated[completion.index] += len(completion.token_ids)
                    choice = self._stream_choice(request, completion, parsers[completion.index])
                    if choice is None:
                        continue
                    chunk = self._chunk(request, request_id, created, choice)
                    if request.include_continuous_usage:
                        chunk.usage = UsageInfo.of(len(prompt), num_generated[completion.index])
                    yield _event(chunk)
            if request.include_usage:
                finals = [final] if final else []
                chunk = ChatCompletionStreamResponse(
                    id=request_id,
                    created=created,
                    model=self.models.response_name(request.model),
                    choices=[],
                    usage=self.usage(len(prompt), sum(num_generated), finals),
                    metrics=per_request_metrics(finals, request.n),
                )
                yield _event(chunk)
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            yield error_event(e, request_id)
        yield DONE_EVENT


def _stream_delta(completion: CompletionOutput, parser: Parser | None) -> DeltaMessage | None:
    """The step's delta: its text, or what the parser makes of it (None: nothing to send)."""
    if parser is None:
        return DeltaMessage(content=completion.text)
    delta = parser.parse_delta(completion.text, list(completion.token_ids), completion.finish_reason is not None)
    if delta is None and completion.finish_reason is not None:
        return DeltaMessage()  # the finish reason still goes out
    return delta


def _event(chunk: ChatCompletionStreamResponse) -> str:
    """A chunk's event; the usage and the metrics only when the chunk carries them."""
    absent = {name for name in ("usage", "metrics") if getattr(chunk, name) is None}
    return sse_event(chunk.model_dump_json(exclude=absent or None))
