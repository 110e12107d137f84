"""ToolParser: finds the tool calls in a model's reply (`--tool-call-parser NAME`, with
`--enable-auto-tool-choice`), and ToolParserManager, the registry of parsers by name.

A parser does two things, as vLLM's: `extract_tool_calls` reads a whole reply (a reply
that does not parse is content, never an error), and `extract_tool_calls_streaming` turns
each streamed step into OpenAI's tool-call deltas. Here a parser streams by describing the
text so far (`parse_streaming`: the content so far and each call's name and arguments so
far) and the base class sends what grew since the last step, so any split of the text
into deltas sends the same calls.
"""

import abc
import dataclasses
from collections.abc import Sequence

from serving.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall, ToolCall, make_tool_call_id
from serving.tool_parsers.utils import StreamedToolCall, get_json_schema_from_tools
from vjx.utils.registry import LazyRegistry


@dataclasses.dataclass
class ExtractedToolCallInformation:
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None = None
    """The reply's text besides the calls (None: none)."""


class ToolParser(abc.ABC):
    supports_required_and_named: bool = True
    """vLLM's: whether `tool_choice="required"` and named choices take the JSON grammar
    (False: the parser's own format is forced and parsed as for "auto")."""

    def __init__(self, tokenizer, tools: list | None = None):
        self.model_tokenizer = tokenizer
        self.tools = tools or []
        self.sent_content = ""
        self.streamed_tool_calls: list[StreamedToolCall] = []
        """What the stream has sent of each call."""

    @property
    def vocab(self) -> dict[str, int]:
        return self.model_tokenizer.get_vocab()

    def adjust_request(self, request):
        """The request as the parser needs it (e.g. its tool-call tokens left in the text)."""
        return request

    def json_schema(self, request) -> dict | None:
        """The grammar a forced tool choice puts on the reply (None: none)."""
        if not self.supports_required_and_named:
            return None
        return get_json_schema_from_tools(request.effective_tool_choice, request.tools, request.parallel_tool_calls)

    @abc.abstractmethod
    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        """The content and the calls of a whole reply."""

    @abc.abstractmethod
    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        """The content so far and the calls so far in the text streamed until now; text that
        may begin a tool call's marker waits for the next delta unless `finished`."""

    def finish_streaming(self, current_text: str, request) -> DeltaMessage | None:
        """What the last step still owes: content held back as a possible marker's start."""
        content, calls = self.parse_streaming(current_text, request, finished=True)
        return self._delta(content, calls)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request,
    ) -> DeltaMessage | None:
        """What this step adds: content, new calls (id, type, name and the arguments so far)
        and more of the announced calls' arguments; None when nothing is new."""
        return self._delta(*self.parse_streaming(current_text, request))

    def _delta(self, content: str, calls: list[StreamedToolCall]) -> DeltaMessage | None:
        delta_content = None
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            delta_content, self.sent_content = content[len(self.sent_content) :], content
        return _with_calls(delta_content, self._tool_call_deltas(calls))

    def _tool_call_deltas(self, calls: list[StreamedToolCall]) -> list[DeltaToolCall]:
        deltas = []
        for index, call in enumerate(calls):
            if index == len(self.streamed_tool_calls):
                if call.name is None:
                    break  # calls come in order: a later one waits for this one's name
                self.streamed_tool_calls.append(call)
                function = DeltaFunctionCall(name=call.name, arguments=call.arguments)
                deltas.append(DeltaToolCall(index=index, id=make_tool_call_id(), type="function", function=function))
                continue
            sent = self.streamed_tool_calls[index].arguments
            if call.arguments.startswith(sent) and len(call.arguments) > len(sent):
                self.streamed_tool_calls[index] = call
                function = DeltaFunctionCall(arguments=call.arguments[len(sent) :])
                deltas.append(DeltaToolCall(index=index, function=function))
        return deltas


def _with_calls(content: str | None, tool_calls: list[DeltaToolCall]) -> DeltaMessage | None:
    if content is None and not tool_calls:
        return None
    return DeltaMessage(content=content, tool_calls=tool_calls or None)


class ToolParserManager(LazyRegistry):
    """Parsers by name: built-in ones registered lazily (module, class), imported on first
    use; `register_module` adds a class under one or more names."""

    kind = "Tool parser"
    base = ToolParser

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        return cls.get(name)
