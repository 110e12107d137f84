"""The tool "parsers" of a forced tool choice, whose reply the JSON grammar shapes (vLLM's
`required` and named-function handling, for parsers that take the JSON grammar):

- a named function: the reply is the arguments object itself, taken as written;
- "required": the reply is a JSON array of `{"name": ..., "parameters": {...}}`, each a call
  whose arguments are re-written as JSON text (so a stream sends the same text).
"""

import json

from serving.protocol import FunctionCall, ToolCall
from serving.tool_parsers.abstract_tool_parser import ExtractedToolCallInformation, ToolParser
from serving.tool_parsers.utils import StreamedToolCall, iter_json_objects, streamed_object_call


class NamedToolCallParser(ToolParser):
    def __init__(self, tokenizer, function_name: str):
        super().__init__(tokenizer)
        self.function_name = function_name

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        if not model_output.strip():
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=None)
        call = ToolCall(function=FunctionCall(name=self.function_name, arguments=model_output))
        return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content=None)

    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        return "", [StreamedToolCall(self.function_name, current_text)] if current_text else []


class RequiredToolCallParser(ToolParser):
    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        """The array's calls; none (and no content) when the reply is not such an array."""
        try:
            items = json.loads(model_output)
            tool_calls = [
                ToolCall(
                    function=FunctionCall(
                        name=item["name"], arguments=json.dumps(item.get("parameters"), ensure_ascii=False)
                    )
                )
                for item in items
            ]
        except (ValueError, KeyError, TypeError):
            tool_calls = []
        return ExtractedToolCallInformation(tools_called=bool(tool_calls), tool_calls=tool_calls, content=None)

    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        start = current_text.find("[")
        if start == -1:
            return "", []
        calls = []
        for object_start, object_end in iter_json_objects(current_text, start + 1):
            calls.append(streamed_object_call(current_text, object_start, object_end, "parameters"))
            if calls[-1].name is None:
                break
        return "", calls
