"""Tool-call parsers (`--tool-call-parser NAME`), registered lazily by name as in vLLM."""

from serving.tool_parsers.abstract_tool_parser import ExtractedToolCallInformation, ToolParser, ToolParserManager
from serving.tool_parsers.utils import StreamedToolCall

_TOOL_PARSERS_TO_REGISTER = {
    "hermes": ("hermes_tool_parser", "Hermes2ProToolParser"),
    "llama3_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "llama4_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "mistral": ("mistral_tool_parser", "MistralToolParser"),
    "pythonic": ("pythonic_tool_parser", "PythonicToolParser"),
}
"""Name -> (module under serving.tool_parsers, class)."""

for _name, (_module, _class_name) in _TOOL_PARSERS_TO_REGISTER.items():
    ToolParserManager.register_lazy_module(_name, f"serving.tool_parsers.{_module}", _class_name)

__all__ = ["ExtractedToolCallInformation", "StreamedToolCall", "ToolParser", "ToolParserManager"]
