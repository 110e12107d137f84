"""ReasoningParser: splits a reasoning model's output into its reasoning and its content,
and ReasoningParserManager, the registry `--reasoning-parser NAME` resolves through.

Two consumers, as in vLLM: the chat server (the `reasoning` of a reply, and the reasoning
deltas of a stream) and the engine core, which asks `is_reasoning_end` of each structured-
output request's tokens so that its grammar only constrains what follows the reasoning.
Nothing here may import `serving`: the engine uses it.
"""

import abc
import dataclasses
import functools
from collections.abc import Sequence

from vjx.utils.registry import LazyRegistry


@dataclasses.dataclass(frozen=True)
class ReasoningDelta:
    """What one streamed step adds to the reasoning and to the content (None: nothing)."""

    reasoning: str | None = None
    content: str | None = None


class ReasoningParser(abc.ABC):
    """One request's (or one choice's) parser; streaming methods may keep state in it.

    `chat_template_kwargs` are the request's template variables: a parser whose model can
    turn its reasoning off (Qwen3's `enable_thinking`) reads them."""

    def __init__(self, tokenizer, *, chat_template_kwargs: dict | None = None):
        self.model_tokenizer = tokenizer
        self.chat_template_kwargs = chat_template_kwargs or {}

    @functools.cached_property
    def vocab(self) -> dict[str, int]:
        return self.model_tokenizer.get_vocab()

    @abc.abstractmethod
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the reasoning has ended by the last of `input_ids` (the prompt's and the
        output's tokens so far): what the engine core gates a grammar on."""

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Sequence[int]) -> bool:
        """`is_reasoning_end` for a decode step whose new tokens are `delta_ids`; a parser
        may look at the new tokens only, so a step costs no more as the output grows."""
        return self.is_reasoning_end(input_ids)

    @abc.abstractmethod
    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The token ids of the content: those after the reasoning."""

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """Output tokens inside the reasoning (0 where a parser cannot tell)."""
        return 0

    @abc.abstractmethod
    def extract_reasoning(self, model_output: str, request=None) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output; None where a part is empty."""

    @abc.abstractmethod
    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> ReasoningDelta | None:
        """What `delta_text` adds to each part; None when it adds nothing to be sent."""


class ReasoningParserManager(LazyRegistry):
    """Parsers by name. Built-in ones are registered lazily (module, class) and imported on
    first use; `register_module` adds a class under one or more names."""

    kind = "Reasoning parser"
    base = ReasoningParser

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        return cls.get(name)
