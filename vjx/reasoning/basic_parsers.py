"""BaseThinkingReasoningParser: reasoning between a start and an end token (`<think>` and
`</think>`), both single tokens of the tokenizer's vocabulary.

Streaming is stateless: each step splits the text so far the way `extract_reasoning` splits
a whole output and sends what each part gained, so the streamed parts always add up to the
non-streamed ones (vLLM's token-id rules can disagree with its own non-streamed split, e.g.
on a second end tag).
"""

import abc
from collections.abc import Sequence
from itertools import islice

from vjx.reasoning.abs_reasoning_parsers import ReasoningDelta, ReasoningParser


class BaseThinkingReasoningParser(ReasoningParser):
    start_token: str
    end_token: str
    name: str
    """The `--reasoning-parser` name, for errors."""

    def __init__(self, tokenizer, *, chat_template_kwargs: dict | None = None):
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs)
        missing = [token for token in (self.start_token, self.end_token) if token not in self.vocab]
        if missing:
            raise ValueError(
                f"reasoning_parser {self.name!r} needs {self.start_token!r} and {self.end_token!r} as tokens "
                f"of the model's tokenizer, which lacks {' and '.join(map(repr, missing))}: the model does "
                "not write its reasoning this way."
            )
        self.start_token_id = self.vocab[self.start_token]
        self.end_token_id = self.vocab[self.end_token]

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """The last start or end token decides: a start opens a new reasoning block."""
        for token_id in reversed(input_ids):
            if token_id == self.start_token_id:
                return False
            if token_id == self.end_token_id:
                return True
        return False

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Sequence[int]) -> bool:
        return self.end_token_id in delta_ids

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids after the first end token; none while nothing follows it."""
        if self.end_token_id not in islice(input_ids, 0, max(0, len(input_ids) - 1)):
            return []
        return input_ids[input_ids.index(self.end_token_id) + 1 :]

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens between start and end tokens (nested blocks counted once; a stray end
        token is ignored)."""
        count = depth = 0
        for token_id in token_ids:
            if token_id == self.start_token_id:
                depth += 1
            elif token_id == self.end_token_id:
                depth = max(0, depth - 1)
            elif depth:
                count += 1
        return count

    @abc.abstractmethod
    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of `text`, empty strings for empty parts: `extract_reasoning`
        without the Nones, applied to whole outputs and to every streamed prefix."""

    def extract_reasoning(self, model_output: str, request=None) -> tuple[str | None, str | None]:
        reasoning, content = self.split(model_output)
        return reasoning or None, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> ReasoningDelta | None:
        previous = self.split(previous_text)
        current = self.split(current_text)
        # A part that is not an extension of what was sent (a start tag after some text)
        # cannot be taken back; only its growth from then on is sent.
        reasoning, content = (new[len(old) :] if new.startswith(old) else "" for old, new in zip(previous, current))
        if not reasoning and not content:
            return None
        return ReasoningDelta(reasoning=reasoning or None, content=content or None)
