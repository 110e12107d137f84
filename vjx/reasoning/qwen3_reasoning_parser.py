"""`--reasoning-parser qwen3`: Qwen3's `<think>...</think>`, as vLLM 0.32 splits it.

With thinking on (the default; the request's `chat_template_kwargs` may set
`enable_thinking: false`) the output is reasoning until `</think>` or until a `<tool_call>`,
which ends the reasoning implicitly and starts the content. A `<think>` inside the reasoning
and a repeated `</think>` inside the content are dropped. With thinking off everything is
content.
"""

from collections.abc import Sequence

from vjx.reasoning.basic_parsers import BaseThinkingReasoningParser

TOOL_CALL_START = "<tool_call>"


class Qwen3ReasoningParser(BaseThinkingReasoningParser):
    start_token = "<think>"
    end_token = "</think>"
    name = "qwen3"

    def __init__(self, tokenizer, *, chat_template_kwargs: dict | None = None):
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.thinking_enabled = self.chat_template_kwargs.get("enable_thinking", True)
        self.tool_call_token_id = self.vocab.get(TOOL_CALL_START)

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        if not self.thinking_enabled:
            return True
        for token_id in reversed(input_ids):
            if token_id == self.start_token_id:
                return False
            if token_id in (self.end_token_id, self.tool_call_token_id):
                return True
        return False

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Sequence[int]) -> bool:
        if not self.thinking_enabled:
            return True
        return self.end_token_id in delta_ids or (
            self.tool_call_token_id is not None and self.tool_call_token_id in delta_ids
        )

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return list(input_ids) if not self.thinking_enabled else super().extract_content_ids(input_ids)

    def split(self, text: str) -> tuple[str, str]:
        if not self.thinking_enabled:
            return "", text
        end = text.find(self.end_token)
        tool_call = text.find(TOOL_CALL_START)
        if tool_call != -1 and (end == -1 or tool_call < end):
            reasoning, content = text[:tool_call], text[tool_call:]
        elif end != -1:
            reasoning, content = text[:end], text[end + len(self.end_token) :]
        else:
            reasoning, content = text, ""
        return reasoning.replace(self.start_token, ""), content.replace(self.end_token, "")
