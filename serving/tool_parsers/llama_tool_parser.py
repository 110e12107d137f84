"""`--tool-call-parser llama3_json` (and `llama4_json`): Llama 3.x's JSON calls,
`{"name": ..., "parameters": {...}}` (or "arguments"), several separated by `; `,
optionally after `<|python_tag|>`.

As vLLM: a whole reply yields a call for every JSON object in it (text around them is
dropped; an object without a name makes the reply content); a stream parses calls only when
the reply starts with `<|python_tag|>` or `{`, and is content otherwise.
"""

import json
import logging

from serving.protocol import FunctionCall, ToolCall
from serving.tool_parsers.abstract_tool_parser import ExtractedToolCallInformation, ToolParser
from serving.tool_parsers.utils import StreamedToolCall, iter_json_objects, streamed_object_call

logger = logging.getLogger(__name__)
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser(ToolParser):
    bot_token = "<|python_tag|>"

    def __init__(self, tokenizer, tools: list | None = None):
        super().__init__(tokenizer, tools)
        if self.bot_token not in self.vocab:
            raise ValueError(
                f"tool_call_parser 'llama3_json' needs {self.bot_token!r} as a token of the model's tokenizer, "
                "which lacks it: the model does not write Llama 3 tool calls."
            )

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        not_called = ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        tool_calls, end = [], -1
        for start in (i for i, char in enumerate(model_output) if char == "{"):
            if start <= end:
                continue  # a brace inside an object already read
            try:
                call, length = _DECODER.raw_decode(model_output[start:])
                arguments = call["arguments"] if "arguments" in call else call["parameters"]
                name = call["name"]
            except (ValueError, KeyError, TypeError):
                logger.debug("llama3_json: a JSON object in the reply is not a tool call; it is content.")
                return not_called
            end = start + length
            tool_calls.append(
                ToolCall(function=FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
            )
        if not tool_calls:
            return not_called
        return ExtractedToolCallInformation(tools_called=True, tool_calls=tool_calls, content=None)

    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        if not current_text.startswith((self.bot_token, "{")):
            return current_text, []
        start = len(self.bot_token) if current_text.startswith(self.bot_token) else 0
        calls = []
        for object_start, object_end in iter_json_objects(current_text, start, ";"):
            calls.append(streamed_object_call(current_text, object_start, object_end, "arguments|parameters"))
            if calls[-1].name is None:
                break
        return "", calls
