"""`--tool-call-parser mistral`: Mistral's `[TOOL_CALLS]` calls, in the format the
tokenizer's version writes (told apart as vLLM does, by `[ARGS]` in the vocabulary):

- before v11: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (or one object);
  arguments are re-written as JSON text (a string is kept as it is);
- v11 and later: `[TOOL_CALLS]name[ARGS]{...}` (or `name{...}`) per call; arguments are the
  first JSON value after the name, as written.

The content is the text before the first `[TOOL_CALLS]` (None when blank). Call ids are 9
letters and digits, as Mistral's chat templates require. For `tool_choice="required"` or a
named function the grammar forces a bare JSON array of `{"name", "arguments"}` objects (vLLM's
schema for these tokenizers), which is parsed without the marker.
"""

import json
import logging
import random
import re
import string

from serving.protocol import FunctionCall, ToolCall
from serving.tool_parsers.abstract_tool_parser import ExtractedToolCallInformation, ToolParser
from serving.tool_parsers.utils import (
    StreamedToolCall,
    iter_json_objects,
    json_prefix,
    partial_tag_overlap,
    streamed_object_call,
)

logger = logging.getLogger(__name__)
_ALPHANUMERIC = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()
_V11_NAME = re.compile(r"\s*([^\[{\s]*)\s*(\[ARGS\]|\{)")


def make_mistral_tool_call_id() -> str:
    return "".join(random.choices(_ALPHANUMERIC, k=9))


def _is_forced(request) -> bool:
    """`required` or a named function: the reply is the grammar's bare JSON array."""
    return request.effective_tool_choice not in ("auto", "none")


class MistralToolParser(ToolParser):
    bot_token = "[TOOL_CALLS]"
    args_token = "[ARGS]"
    supports_required_and_named = False

    def __init__(self, tokenizer, tools: list | None = None):
        super().__init__(tokenizer, tools)
        if self.bot_token not in self.vocab:
            raise ValueError(
                f"tool_call_parser 'mistral' needs {self.bot_token!r} as a token of the model's tokenizer, "
                "which lacks it: the model does not write Mistral tool calls."
            )
        self.is_pre_v11 = self.args_token not in self.vocab

    def adjust_request(self, request):
        # [TOOL_CALLS] is a special token: skipping those would hide the calls.
        if request.tools and request.effective_tool_choice != "none":
            return request.model_copy(update={"skip_special_tokens": False})
        return request

    def json_schema(self, request) -> dict | None:
        """vLLM's schema for these tokenizers: an array of `{"name", "arguments"}` objects,
        of the named function only (one item) or of every tool."""
        choice = request.effective_tool_choice
        if not _is_forced(request):
            return None
        tools = (
            request.tools
            if choice == "required"
            else [t for t in request.tools if t.function.name == choice.function.name]
        )
        any_of = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "arguments": tool.function.parameters or {"type": "object"},
                },
                "required": ["name", "arguments"],
            }
            for tool in tools
        ]
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": any_of}}
        return schema if choice == "required" else {**schema, "maxItems": 1}

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        content, marker, calls_text = model_output.partition(self.bot_token)
        if not marker and not _is_forced(request):
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        if not marker:
            content, calls_text = "", model_output
        if self.is_pre_v11 or not marker:
            # Repeated markers count as one; text after a later marker is not read (vLLM's).
            calls_text = next((part.strip() for part in calls_text.split(self.bot_token) if part.strip()), "")
            calls = _json_calls(calls_text)
        else:
            calls = [_v11_call(segment) for segment in calls_text.split(self.bot_token)]
        if not calls:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=calls_text if marker else model_output
            )
        tool_calls = [ToolCall(id=make_mistral_tool_call_id(), function=call) for call in calls]
        return ExtractedToolCallInformation(
            tools_called=True, tool_calls=tool_calls, content=content.strip() and content or None
        )

    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        first = current_text.find(self.bot_token)
        if first == -1 and not _is_forced(request):
            held = 0 if finished else partial_tag_overlap(current_text, self.bot_token)
            return current_text[: len(current_text) - held], []
        content = current_text[:first] if first != -1 else ""
        calls_text = current_text[first + len(self.bot_token) :] if first != -1 else current_text
        if self.is_pre_v11 or first == -1:
            return content, _streamed_json_calls(calls_text)
        return content, [_streamed_v11_call(segment) for segment in calls_text.split(self.bot_token)]

    def _tool_call_deltas(self, calls):
        deltas = super()._tool_call_deltas(calls)
        for delta in deltas:
            if delta.id is not None:
                delta.id = make_mistral_tool_call_id()
        return deltas


def _json_calls(text: str) -> list[FunctionCall]:
    """The calls of the JSON array (or object) at the start of `text` (vLLM's pre-v11 rules:
    items without a name or arguments are skipped, a missing name is "")."""
    try:
        parsed = _DECODER.raw_decode(text)[0]
    except json.JSONDecodeError:
        logger.debug("mistral: no JSON after [TOOL_CALLS]; the reply is content.")
        return []
    calls = []
    for item in [parsed] if isinstance(parsed, dict) else parsed if isinstance(parsed, list) else []:
        if not isinstance(item, dict) or not ("name" in item or "arguments" in item):
            continue
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            arguments = "{}" if arguments is None else json.dumps(arguments, ensure_ascii=False)
        name = item.get("name")
        calls.append(FunctionCall(name=name if isinstance(name, str) else "", arguments=arguments))
    return calls


def _streamed_json_calls(text: str) -> list[StreamedToolCall]:
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":
        start += 1
    calls = []
    for object_start, object_end in iter_json_objects(text, start):
        call = streamed_object_call(text, object_start, object_end, "arguments")
        if call.arguments.startswith('"'):
            # Arguments given as a JSON string are that string: sent once it is whole.
            try:
                call = StreamedToolCall(call.name, json.loads(call.arguments))
            except json.JSONDecodeError:
                call = StreamedToolCall(call.name)
        calls.append(call)
        if call.name is None:
            break
    return calls


def _raw_arguments(text: str) -> str:
    """The first JSON value of `text` as written (what follows it is dropped), or all of
    `text` when it does not parse; `{}` when empty."""
    stripped = text.strip()
    if not stripped:
        return "{}"
    end = json_prefix(stripped)[1]
    return stripped if end is None else stripped[:end]


def _v11_call(segment: str) -> FunctionCall:
    match = _V11_NAME.match(segment)
    if match is None:
        return FunctionCall(name=segment.strip(), arguments="{}")
    arguments_start = match.end() if match.group(2) == "[ARGS]" else match.start(2)
    return FunctionCall(name=match.group(1), arguments=_raw_arguments(segment[arguments_start:]))


def _streamed_v11_call(segment: str) -> StreamedToolCall:
    match = _V11_NAME.match(segment)
    if match is None:
        return StreamedToolCall(None)
    arguments_start = match.end() if match.group(2) == "[ARGS]" else match.start(2)
    arguments = segment[arguments_start:].lstrip()
    end = json_prefix(arguments)[1]
    return StreamedToolCall(match.group(1), arguments if end is None else arguments[:end])
