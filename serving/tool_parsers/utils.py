"""What the tool parsers share: reading a JSON value from the front of a text that may still
be growing, a tag's partial overlap with a text's end, and vLLM's JSON schema of a forced
tool call.

`json_prefix` is what keeps a stream and a whole reply equal: a non-streamed reply's
arguments are `json.dumps(value, ensure_ascii=False)` of the parsed JSON (vLLM's), so a
stream sends that same text, token by token as the JSON grows, never something it would
have to take back (a number is sent once a delimiter ends it, a string's escape once whole).
"""

import copy
import dataclasses
import json
import re

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = ("true", "false", "null")
_CLOSING = {"{": "}", "[": "]"}
_TRAILING_ESCAPE = re.compile(r"(\\+)(u[0-9a-fA-F]{0,3})?$")
_AFTER_NUMBER = ",]} \t\r\n"


@dataclasses.dataclass(frozen=True)
class StreamedToolCall:
    """One call as far as the text shows it: its name once whole, and the arguments' text
    so far (a prefix of what the finished call's arguments will be)."""

    name: str | None
    arguments: str = ""


class _Incomplete(Exception):
    """The text ends inside a token (or is not JSON from here on)."""


def _string_end(text: str, start: int) -> int:
    """The index after the closing quote of the string opening at `start`."""
    i = start + 1
    while True:
        i = text.find('"', i)
        if i == -1:
            raise _Incomplete
        num_backslashes = len(text[:i]) - len(text[:i].rstrip("\\"))
        if num_backslashes % 2 == 0:
            return i + 1
        i += 1


def _partial_string(text: str, start: int) -> str:
    """`json.dumps` of the unfinished string's text so far, without the closing quote."""
    body = text[start + 1 :]
    escape = _TRAILING_ESCAPE.search(body)
    if escape and len(escape.group(1)) % 2:
        body = body[: escape.start() + len(escape.group(1)) - 1]  # an escape still being written
    try:
        value = json.loads(f'"{body}"')
    except json.JSONDecodeError:
        return ""
    if value and "\ud800" <= value[-1] <= "\udbff":
        value = value[:-1]  # half of a surrogate pair: its other half is still to come
    return json.dumps(value, ensure_ascii=False)[:-1]


def _scalar(text: str, i: int) -> tuple[str, int]:
    """A number or a literal at `i`, re-written as json.dumps writes it, and its end."""
    for literal in _LITERALS:
        if text.startswith(literal, i):
            return literal, i + len(literal)
        if literal.startswith(text[i:]):
            raise _Incomplete
    match = _NUMBER.match(text, i)
    if match is None or match.end() == len(text) or text[match.end()] not in _AFTER_NUMBER:
        raise _Incomplete  # not a number, or more of it may follow
    return json.dumps(json.loads(match.group(0))), match.end()


def json_prefix(text: str, start: int = 0) -> tuple[str, int | None]:
    """The JSON value at `start` (after whitespace) as far as it can be known, written as
    `json.dumps(value, ensure_ascii=False)` writes it; and the index after the value once it
    is complete (None before). Where the text stops being JSON the prefix stops too."""
    pieces, stack, i = [], [], start
    try:
        while i < len(text):
            char = text[i]
            if char.isspace():
                i += 1
                continue
            if char in "{[":
                stack.append(_CLOSING[char])
                pieces.append(char)
                i += 1
            elif char in "}]":
                if not stack or stack.pop() != char:
                    raise _Incomplete
                pieces.append(char)
                i += 1
            elif char in ",:":
                if not stack:
                    raise _Incomplete
                pieces.append(char + " ")
                i += 1
            elif char == '"':
                try:
                    end = _string_end(text, i)
                except _Incomplete:
                    pieces.append(_partial_string(text, i))
                    raise
                pieces.append(json.dumps(json.loads(text[i:end]), ensure_ascii=False))
                i = end
            else:
                piece, i = _scalar(text, i)
                pieces.append(piece)
            if not stack:
                return "".join(pieces), i
    except (_Incomplete, json.JSONDecodeError):
        pass
    return "".join(pieces), None


def iter_json_objects(text: str, start: int, separators: str = ","):
    """(start, end) of each object of a run `{...} SEP {...} ...` from `start` (end None for
    the unfinished last one); the run ends at anything else (e.g. a closing `]`)."""
    i = start
    while True:
        while i < len(text) and (text[i].isspace() or text[i] in separators):
            i += 1
        if i >= len(text) or text[i] != "{":
            return
        end = json_prefix(text, i)[1]
        yield i, end
        if end is None:
            return
        i = end


_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')


def streamed_object_call(text: str, start: int, end: int | None, arguments_keys: str) -> StreamedToolCall:
    """The call an object `{"name": ..., KEY: {...}}` at text[start:end] shows so far; KEY is
    the first of `arguments_keys` (a regex alternation) present."""
    body = text[start : len(text) if end is None else end]
    name = _NAME.search(body)
    if name is None:
        return StreamedToolCall(None)
    arguments = re.search(rf'"(?:{arguments_keys})"\s*:\s*', body)
    return StreamedToolCall(
        json.loads(name.group(1)), json_prefix(body, arguments.end())[0] if arguments is not None else ""
    )


def partial_tag_overlap(text: str, tag: str) -> int:
    """The length of the longest proper prefix of `tag` that `text` ends with: text that may
    be the start of the tag, held back until the next delta tells."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


def _params_or_empty_object(params: dict | None) -> dict:
    return copy.deepcopy(params) if params else {"type": "object", "properties": {}}


def get_json_schema_from_tools(tool_choice, tools: list, parallel_tool_calls: bool | None = True) -> dict | None:
    """vLLM's grammar for a forced call: a named function's parameters schema, or for
    "required" a non-empty array of `{"name", "parameters"}` objects, one per tool (one item
    at most with `parallel_tool_calls=False`); None for "auto" and "none"."""
    if tool_choice in ("none", "auto", None) or not tools:
        return None
    if not isinstance(tool_choice, str):
        tool = next(tool for tool in tools if tool.function.name == tool_choice.function.name)
        return _params_or_empty_object(tool.function.parameters)
    schemas, defs = [], {}
    for tool in tools:
        params = _params_or_empty_object(tool.function.parameters)
        defs.update(params.pop("$defs", {}) or {})
        schemas.append(
            {
                "properties": {"name": {"type": "string", "enum": [tool.function.name]}, "parameters": params},
                "required": ["name", "parameters"],
            }
        )
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": schemas}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema
