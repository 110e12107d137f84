"""`--tool-call-parser pythonic`: calls written as a Python list of calls with literal
keyword arguments, `[get_weather(city="Paris"), get_time(zone='CET')]` (Llama 3.2 / 4,
ToolACE). A reply that is not exactly such a list is content. A stream announces a call at
its `(` and sends its arguments when its `)` closes it.
"""

import ast
import json
import logging
import re

from serving.protocol import FunctionCall, ToolCall
from serving.tool_parsers.abstract_tool_parser import ExtractedToolCallInformation, ToolParser
from serving.tool_parsers.utils import StreamedToolCall

logger = logging.getLogger(__name__)
_JSON_NAMES = {"null": None, "true": True, "false": False}
_CALL_START = re.compile(r"\s*,?\s*([A-Za-z_][\w.]*)\s*\(")


class UnexpectedAstError(ValueError):
    """The text is Python, but not a list of calls with literal arguments."""


def get_parameter_value(node: ast.expr):
    """A literal argument's value; JSON's null/true/false are taken too (vLLM's rules)."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str | int | float)):
        return node.value
    if isinstance(node, ast.Dict) and all(isinstance(key, ast.Constant) for key in node.keys):
        return {key.value: get_parameter_value(value) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [get_parameter_value(element) for element in node.elts]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = get_parameter_value(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise UnexpectedAstError(f"tool call arguments must be literals, got {ast.dump(node)}")


def _dotted_name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise UnexpectedAstError("a tool call's function must be a (dotted) name")
    return ".".join([node.id, *reversed(parts)])


def handle_single_tool(call: ast.expr) -> FunctionCall:
    if not isinstance(call, ast.Call) or call.args:
        raise UnexpectedAstError("a tool call takes keyword arguments only")
    arguments = {keyword.arg: get_parameter_value(keyword.value) for keyword in call.keywords}
    return FunctionCall(name=_dotted_name(call.func), arguments=json.dumps(arguments, ensure_ascii=False))


def _call_end(text: str, start: int) -> int | None:
    """The index after the `)` closing the call whose `(` is at `start`; None before it."""
    depth, quote, i = 0, None, start
    while i < len(text):
        char = text[i]
        if quote is not None:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


class PythonicToolParser(ToolParser):
    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        try:
            parsed = ast.parse(model_output.strip(), mode="eval").body if model_output.startswith("[") else None
            if not isinstance(parsed, ast.List) or not parsed.elts:
                raise UnexpectedAstError("the reply is not a list of calls")
            tool_calls = [ToolCall(function=handle_single_tool(element)) for element in parsed.elts]
        except (SyntaxError, ValueError):
            logger.debug("pythonic: the reply is not a list of tool calls; it is content.")
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        return ExtractedToolCallInformation(tools_called=True, tool_calls=tool_calls, content=None)

    def parse_streaming(self, current_text: str, request, finished: bool = False) -> tuple[str, list[StreamedToolCall]]:
        if not current_text.startswith("["):
            return current_text, []
        calls, i = [], 1
        while (start := _CALL_START.match(current_text, i)) is not None:
            end = _call_end(current_text, start.end() - 1)
            if end is None:
                calls.append(StreamedToolCall(start.group(1)))
                break
            try:
                function = handle_single_tool(ast.parse(current_text[start.start(1) : end], mode="eval").body)
            except (SyntaxError, ValueError):
                break
            calls.append(StreamedToolCall(function.name, function.arguments))
            i = end
        return "", calls
