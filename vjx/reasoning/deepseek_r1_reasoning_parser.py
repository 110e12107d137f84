"""`--reasoning-parser deepseek_r1`: DeepSeek R1's `<think>...</think>`.

The chat template may open the block in the prompt, so an output without `<think>` is
reasoning up to `</think>`; an output that never closes it is all reasoning (vLLM's rules).
"""

from vjx.reasoning.basic_parsers import BaseThinkingReasoningParser


class DeepSeekR1ReasoningParser(BaseThinkingReasoningParser):
    start_token = "<think>"
    end_token = "</think>"
    name = "deepseek_r1"

    def split(self, text: str) -> tuple[str, str]:
        before, start, after = text.partition(self.start_token)
        text = after if start else before
        reasoning, _, content = text.partition(self.end_token)
        return reasoning, content
