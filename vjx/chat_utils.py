"""Chat messages -> prompt text for `LLM.chat`, the way vLLM renders them offline.

A conversation is a list of OpenAI-style message dicts; a message's content is a string, None
or a list of content parts (strings or `{"type": "text", "text": ...}`). vjx serves text
models, so any other part (`image_url`, `input_audio`, ...) is a ValueError. The content is
handed to the chat template in one of vLLM's two formats: "string" (the text parts joined by
newlines) or "openai" (a list of `{"type": "text", "text": ...}`); "auto" picks "openai" when
the template loops over a message's content, else "string".
"""

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONTENT_FORMATS = ("auto", "string", "openai")
TEXT_PART_TYPES = ("text", "input_text", "output_text", "refusal")
"""Content parts whose text goes to the template (vLLM's text part types)."""
_RESERVED_KWARGS = ("conversation", "chat_template", "tools", "tokenize", "return_dict")
_CONTENT_LOOP = re.compile(r"for\s+\w+\s+in\s+\w+\s*(\[\s*['\"]content['\"]\s*\]|\.content\b)")
_JINJA_CHARS = "{}\n"
"""A string holding none of these that names no file was meant as a path (vLLM's rule)."""


def load_chat_template(chat_template: Path | str | None) -> str | None:
    """vLLM's `load_chat_template`: the text of the file `chat_template` names, else the string
    itself as a Jinja template. A `Path` that cannot be read, or a string that names no file
    and holds no template syntax, is an error (vLLM's built-in template names are not shipped)."""
    if chat_template is None:
        return None
    try:
        with open(chat_template, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        if isinstance(chat_template, Path) or not any(c in chat_template for c in _JINJA_CHARS):
            raise ValueError(
                f"chat_template {str(chat_template)!r} looks like a file path, but it failed to be opened: {e}"
            ) from None
    return chat_template


def to_conversations(messages) -> list[list[dict]]:
    """One conversation (a list of message dicts) or a list of them, as a list of them."""
    if isinstance(messages, Sequence) and messages and isinstance(messages[0], dict):
        return [list(messages)]
    is_list = isinstance(messages, Sequence) and not isinstance(messages, str)
    if not is_list or not messages or not all(isinstance(c, list | tuple) for c in messages):
        raise ValueError(f"messages must be a list of message dicts or a list of such lists, got {messages!r}.")
    return [list(conversation) for conversation in messages]


def _part_text(part) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict) or "type" not in part:
        raise ValueError(f'a content part must be a str or a dict with a "type", got {part!r}.')
    if part["type"] not in TEXT_PART_TYPES:
        raise ValueError(
            f"content part type {part['type']!r} is not supported: vjx serves text models, so a part "
            f"must be one of {TEXT_PART_TYPES}."
        )
    text = part.get(part["type"]) if part["type"] == "refusal" else part.get("text")
    if not isinstance(text, str):
        raise ValueError(f"a {part['type']!r} content part needs a str text, got {part!r}.")
    return text


def parse_message(message: dict, content_format: str) -> dict:
    """The message as the template sees it: its content in `content_format`, other keys kept."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f'a message must be a dict with a str "role", got {message!r}.')
    content = message.get("content")
    parts = [] if content is None else [content] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise ValueError(f"a message's content must be a str, a list of parts or None, got {content!r}.")
    texts = [_part_text(part) for part in parts]
    parsed = dict(message)
    if content_format == "openai":
        parsed["content"] = [{"type": "text", "text": text} for text in texts]
    else:
        parsed["content"] = "\n".join(texts)
    return parsed


def resolve_content_format(template: str, given: str) -> str:
    """ "string" or "openai": `given`, or for "auto" what the template's text suggests."""
    if given not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {CONTENT_FORMATS}, got {given!r}.")
    if given != "auto":
        return given
    return "openai" if _CONTENT_LOOP.search(template) else "string"


def render_chat(
    tokenizer,
    conversation: list[dict],
    *,
    chat_template: str | None = None,
    content_format: str = "auto",
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The conversation rendered by `tokenizer.apply_chat_template` as text.

    `chat_template_kwargs` reach the template as variables, `add_generation_prompt` and
    `continue_final_message` among them (vLLM refuses both True at once)."""
    kwargs = dict(chat_template_kwargs or {})
    reserved = [key for key in kwargs if key in _RESERVED_KWARGS]
    if reserved:
        raise ValueError(f"chat_template_kwargs cannot set {reserved}: pass them as chat()'s own arguments.")
    if kwargs.get("add_generation_prompt") and kwargs.get("continue_final_message"):
        raise ValueError("Cannot set both `add_generation_prompt` and `continue_final_message` to True.")
    try:
        template = tokenizer.get_chat_template(chat_template, tools)
    except ValueError as e:
        raise ValueError(f"chat_template: {e}") from e
    content_format = resolve_content_format(template, content_format)
    messages = [parse_message(message, content_format) for message in conversation]
    if not messages:
        raise ValueError("a conversation must have at least one message.")
    return tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False, **kwargs)
