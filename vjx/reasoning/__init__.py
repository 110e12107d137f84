"""Reasoning parsers (`--reasoning-parser NAME`), registered lazily by name as in vLLM."""

from vjx.reasoning.abs_reasoning_parsers import ReasoningDelta, ReasoningParser, ReasoningParserManager

_REASONING_PARSERS_TO_REGISTER = {
    "deepseek_r1": ("deepseek_r1_reasoning_parser", "DeepSeekR1ReasoningParser"),
    "qwen3": ("qwen3_reasoning_parser", "Qwen3ReasoningParser"),
}
"""Name -> (module under vjx.reasoning, class)."""

for _name, (_module, _class_name) in _REASONING_PARSERS_TO_REGISTER.items():
    ReasoningParserManager.register_lazy_module(_name, f"vjx.reasoning.{_module}", _class_name)

__all__ = ["ReasoningDelta", "ReasoningParser", "ReasoningParserManager"]
