"""Parser: one chat choice's reasoning parser and tool parser together (vLLM's `Parser`),
and ParserManager, which the server builds once from `--reasoning-parser`,
`--tool-call-parser` and `--enable-auto-tool-choice`.

The reply's text is split first into reasoning and content; the tool parser reads the
content. Which tool parser reads it follows the request's `tool_choice`, as in vLLM: none
for "none", the forced-choice parsers of serving/tool_parsers/streaming.py for "required"
and a named function (when the configured parser takes the JSON grammar), the configured
parser otherwise. A stream runs the same split on the text so far at every step.
"""

import dataclasses

from serving.errors import OpenAIError
from serving.protocol import ChatCompletionRequest, DeltaMessage, ToolCall
from serving.tool_parsers import ToolParser, ToolParserManager
from serving.tool_parsers.streaming import NamedToolCallParser, RequiredToolCallParser
from vjx.reasoning import ReasoningParser, ReasoningParserManager
from vjx.sampling_params import StructuredOutputsParams


@dataclasses.dataclass
class ParsedMessage:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


class Parser:
    def __init__(
        self, request: ChatCompletionRequest, reasoning_parser: ReasoningParser | None, tool_parser: ToolParser | None
    ):
        self.request = request
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self.is_reasoning_ended = reasoning_parser is None
        self.text = ""
        self.token_ids: list[int] = []
        self.content = ""

    def set_prompt_token_ids(self, prompt_token_ids: list[int]) -> None:
        """A prompt whose reasoning already ended (a template that turns thinking off writes
        the whole block) makes the reply all content."""
        if self.reasoning_parser is not None and self.reasoning_parser.is_reasoning_end(prompt_token_ids):
            self.is_reasoning_ended = True

    def parse(self, model_output: str) -> ParsedMessage:
        """A whole reply's parts (tool calls only past `parallel_tool_calls=False`'s one)."""
        reasoning, content = None, model_output
        if not self.is_reasoning_ended:
            reasoning, content = self.reasoning_parser.extract_reasoning(model_output, self.request)
        if not self.request.include_reasoning:
            reasoning = None
        if self.tool_parser is None:
            return ParsedMessage(reasoning, content, [])
        info = self.tool_parser.extract_tool_calls(content or "", self.request)
        if info.tools_called:
            content = info.content if info.content and info.content.strip() else None
        elif self.is_forced and not (content or "").strip():
            content = None
        tool_calls = info.tool_calls if info.tools_called else []
        return ParsedMessage(
            reasoning, content, tool_calls[:1] if self.request.parallel_tool_calls is False else tool_calls
        )

    @property
    def is_forced(self) -> bool:
        return self.request.effective_tool_choice not in ("auto", "none")

    @property
    def num_streamed_tool_calls(self) -> int:
        return len(self.tool_parser.streamed_tool_calls) if self.tool_parser is not None else 0

    def parse_delta(self, delta_text: str, delta_token_ids: list[int], finished: bool = False) -> DeltaMessage | None:
        """What one streamed step adds (reasoning, content, tool-call pieces); None: nothing.
        The last step (`finished`) also sends what the tool parser held back."""
        previous_text, previous_ids = self.text, self.token_ids
        self.text, self.token_ids = previous_text + delta_text, previous_ids + list(delta_token_ids)
        reasoning, content = None, delta_text
        if not self.is_reasoning_ended:
            delta = self.reasoning_parser.extract_reasoning_streaming(
                previous_text, self.text, delta_text, previous_ids, self.token_ids, delta_token_ids
            )
            reasoning, content = (delta.reasoning, delta.content) if delta is not None else (None, None)
        if not self.request.include_reasoning:
            reasoning = None
        tool_calls = None
        if self.tool_parser is not None:
            content, tool_calls = self._tool_call_delta(content or "", delta_token_ids, finished)
            if tool_calls and self.request.parallel_tool_calls is False:
                tool_calls = [call for call in tool_calls if call.index == 0] or None
        if not (reasoning or content or tool_calls):
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None, tool_calls=tool_calls)

    def _tool_call_delta(self, content: str, delta_token_ids: list[int], finished: bool):
        """(content, tool-call deltas) the tool parser makes of the content's new text."""
        messages = []
        if content:
            previous_content, self.content = self.content, self.content + content
            messages.append(
                self.tool_parser.extract_tool_calls_streaming(
                    previous_content, self.content, content, [], [], delta_token_ids, self.request
                )
            )
        if finished:
            messages.append(self.tool_parser.finish_streaming(self.content, self.request))
        messages = [message for message in messages if message is not None]
        content = "".join(message.content or "" for message in messages)
        tool_calls = [call for message in messages for call in message.tool_calls or []]
        return content or None, tool_calls or None


class ParserManager:
    """The server's parser classes, checked against the tokenizer at start-up."""

    def __init__(self, tokenizer, reasoning_parser: str = "", tool_call_parser: str | None = None):
        """`tool_call_parser`: None unless --enable-auto-tool-choice (vLLM's rule: without
        it no tool parser runs, and a request asking for tool calls gets a 400)."""
        self.tokenizer = tokenizer
        self.reasoning_parser_cls = _lookup(ReasoningParserManager.get_reasoning_parser, reasoning_parser)
        self.tool_parser_cls = _lookup(ToolParserManager.get_tool_parser, tool_call_parser)
        flags = {"--reasoning-parser": reasoning_parser, "--tool-call-parser": tool_call_parser}
        for flag, cls in zip(flags, (self.reasoning_parser_cls, self.tool_parser_cls)):
            try:
                if cls is not None:
                    cls(tokenizer)
            except ValueError as e:
                raise ValueError(f"{flag} {flags[flag]} cannot be used with this model's tokenizer: {e}") from None

    @staticmethod
    def check_names(reasoning_parser: str = "", tool_call_parser: str | None = None) -> None:
        """A ValueError listing the registered parsers when a name is not one (before the
        engine starts, so a typo fails fast)."""
        _lookup(ReasoningParserManager.get_reasoning_parser, reasoning_parser)
        _lookup(ToolParserManager.get_tool_parser, tool_call_parser)

    def check_request(self, request: ChatCompletionRequest) -> None:
        """vLLM's 400s for a tool choice the request or the server cannot honour."""
        choice = request.effective_tool_choice
        if request.tools == []:
            raise OpenAIError(
                "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
                400,
                "tools",
            )
        if choice == "none":
            return
        if request.tools is None:
            raise OpenAIError("When using `tool_choice`, `tools` must be set.", 400, "tool_choice")
        if not isinstance(choice, str) and choice.function.name not in {t.function.name for t in request.tools}:
            raise OpenAIError(
                "The tool specified in `tool_choice` does not match any of the specified `tools`", 400, "tool_choice"
            )
        if self.tool_parser_cls is not None:
            return
        if choice == "auto":
            message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        else:
            described = f'"{choice}"' if isinstance(choice, str) else f'function "{choice.function.name}"'
            message = f"tool_choice={described} requires --tool-call-parser to be set"
        raise OpenAIError(message, 400, "tool_choice")

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        if self.tool_parser_cls is None:
            return request
        return self.tool_parser_cls(self.tokenizer, request.tools).adjust_request(request)

    def structured_outputs(self, request: ChatCompletionRequest) -> StructuredOutputsParams | None:
        """The JSON grammar of a forced tool choice (it replaces any the request set)."""
        if self.tool_parser_cls is None or request.effective_tool_choice == "none":
            return None
        schema = self.tool_parser_cls(self.tokenizer, request.tools).json_schema(request)
        return None if schema is None else StructuredOutputsParams(json=schema)

    def get_parser(self, request: ChatCompletionRequest) -> Parser | None:
        """A new parser for one choice; None when nothing is parsed."""
        reasoning_parser = None
        if self.reasoning_parser_cls is not None:
            reasoning_parser = self.reasoning_parser_cls(
                self.tokenizer, chat_template_kwargs=request.chat_template_kwargs
            )
        tool_parser = None
        choice = request.effective_tool_choice
        if self.tool_parser_cls is not None and request.tools and choice != "none":
            if choice == "auto" or not self.tool_parser_cls.supports_required_and_named:
                tool_parser = self.tool_parser_cls(self.tokenizer, request.tools)
            elif choice == "required":
                tool_parser = RequiredToolCallParser(self.tokenizer, request.tools)
            else:
                tool_parser = NamedToolCallParser(self.tokenizer, choice.function.name)
        if reasoning_parser is None and tool_parser is None:
            return None
        return Parser(request, reasoning_parser, tool_parser)


def _lookup(get, name: str | None):
    """The registered class of `name` (None for no name); a ValueError listing the names."""
    if not name:
        return None
    try:
        return get(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
