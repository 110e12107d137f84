"""The prompt types of `LLM.generate` (vLLM's `vllm.inputs`): plain dicts, typed."""

from typing import NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str
    cache_salt: NotRequired[str]
    """Requests with different salts never share prefix-cache blocks."""


class TokensPrompt(TypedDict):
    """A prompt given as token ids."""

    prompt_token_ids: list[int]
    cache_salt: NotRequired[str]


PromptType = str | TextPrompt | TokensPrompt
