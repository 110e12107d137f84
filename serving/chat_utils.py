"""Chat prompts: messages (string or content-part lists) through a chat template."""

import json

from serving.errors import OpenAIError
from serving.protocol import ChatMessage, TextContentPart


def to_text(content: str | list[TextContentPart] | None) -> str:
    """A message's content as one text: its parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(part.text for part in content)
    return content or ""


def conversation_size(messages: list[ChatMessage]) -> int:
    """The characters of the messages' contents: what rendering them through a template costs."""
    return sum(len(to_text(message.content)) for message in messages)


def to_conversation(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the tokenizer's template takes them: content parts joined into one text,
    and (as vLLM hands them to Hugging Face templates) a tool call's JSON arguments as a dict."""
    conversation = []
    for message in messages:
        entry = {"role": message.role, "content": to_text(message.content)}
        for key in ("name", "tool_call_id", "reasoning"):
            if getattr(message, key) is not None:
                entry[key] = getattr(message, key)
        if message.tool_calls is not None:
            entry["tool_calls"] = [_parsed_arguments(call) for call in message.tool_calls]
        conversation.append(entry)
    return conversation


def _parsed_arguments(tool_call: dict) -> dict:
    function = tool_call.get("function")
    if not isinstance(function, dict):
        raise OpenAIError("A message's tool call needs a `function` object.", 400, "messages")
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise OpenAIError(
                f"A message's tool call arguments are not JSON: {arguments!r}.", 400, "messages"
            ) from None
    return {**tool_call, "function": {**function, "arguments": arguments or {}}}


def apply_chat_template(
    tokenizer,
    messages: list[ChatMessage],
    chat_template: str | None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
) -> str:
    """The prompt text of a conversation; a template that fails (or none at all) is a 400.
    `chat_template_kwargs` are extra template variables; the arguments above win over them.
    `tools`: the request's tools (OpenAI's dicts), which the template may describe."""
    if continue_final_message and add_generation_prompt:
        raise OpenAIError(
            "continue_final_message and add_generation_prompt cannot both be true.", 400, "continue_final_message"
        )
    if continue_final_message and messages[-1].role != "assistant":
        raise OpenAIError(
            "continue_final_message needs the last message to be the assistant's.", 400, "continue_final_message"
        )
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise OpenAIError("The model has no chat template; start the server with --chat-template.", 400)
    options = {
        **(chat_template_kwargs or {}),
        "chat_template": chat_template,
        "tokenize": False,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "tools": tools,
    }
    try:
        return tokenizer.apply_chat_template(to_conversation(messages), **options)
    except Exception as e:  # noqa: BLE001 - a template's own error (e.g. raise_exception) is the user's
        raise OpenAIError(f"The chat template failed on these messages: {e}", 400, "messages") from None
