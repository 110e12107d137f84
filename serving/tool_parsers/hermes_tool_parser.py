"""`--tool-call-parser hermes`: Hermes 2 Pro / Qwen 2.5 style calls, each a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` (the last one
may be left open). The content is the text before the first call; text after the calls is
dropped, as vLLM does. A reply whose calls are not all valid JSON is all content.
"""

import json
import logging
import re

from serving.protocol import FunctionCall, ToolCall
from serving.tool_parsers.abstract_tool_parser import ExtractedToolCallInformation, ToolParser
from serving.tool_parsers.utils import StreamedToolCall, partial_tag_overlap, streamed_object_call

logger = logging.getLogger(__name__)


class Hermes2ProToolParser(ToolParser):
    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"
    tool_call_regex = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def adjust_request(self, request):
        # Some models' <tool_call> is a special token: skipping those would hide the calls.
        if request.tools and request.effective_tool_choice != "none":
            return request.model_copy(update={"skip_special_tokens": False})
        return request

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        if self.tool_call_start_token not in model_output:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        try:
            calls = [
                json.loads(closed or left_open) for closed, left_open in self.tool_call_regex.findall(model_output)
            ]
            tool_calls = [
                ToolCall(
                    function=FunctionCall(
                        name=call["name"], arguments=json.dumps(call["arguments"], ensure_ascii=False)
                    )
                )
                for call in calls
            ]
        except (ValueError, KeyError, TypeError):
            logger.debug("hermes: the reply's tool calls are not valid; it is content.")
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        content = model_output[: model_output.find(self.tool_call_start_token)]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=tool_calls, content=content or None)

    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        first = current_text.find(self.tool_call_start_token)
        if first == -1:
            # Text that may be the start of <tool_call> waits for the next delta.
            held = 0 if finished else partial_tag_overlap(current_text, self.tool_call_start_token)
            return current_text[: len(current_text) - held], []
        calls, start = [], first
        while start != -1:
            body_start = start + len(self.tool_call_start_token)
            body_end = current_text.find(self.tool_call_end_token, body_start)
            call = streamed_object_call(current_text, body_start, None if body_end == -1 else body_end, "arguments")
            calls.append(call)
            if body_end == -1 or call.name is None:
                break
            start = current_text.find(self.tool_call_start_token, body_end)
        return current_text[:first], calls
