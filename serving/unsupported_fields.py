"""The request fields vjx does not honour, refused with a 400 instead of ignored.

A client that sends `response_format` expects output shaped by it; silently
dropping them returns something else with a 200. Each field maps to the values that change
nothing (None: the field is absent or null), which stay accepted. Fields the server ignores
because they never change the output (`user`, `store`, `metadata`, `service_tier`, ...) are
not listed.
"""

import json

from pydantic import BaseModel

from serving.errors import OpenAIError

UNSUPPORTED_FIELDS: dict[str, tuple] = {
    # Legacy function calling (OpenAI's deprecated form of tools; vLLM ignores it).
    "functions": (None, []),
    "function_call": (None, "none"),
    # vLLM's old structured-output fields (vLLM now takes `structured_outputs`).
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "guided_decoding_backend": (None,),
    "guided_whitespace_pattern": (None,),
    # Other ways to sample, or to build the prompt.
    "logits_processors": (None, []),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "prompt_embeds": (None,),
    # Other modalities.
    "audio": (None,),
    "modalities": (None, ["text"]),
}
"""Field -> the values that change nothing."""


def check_supported_fields(request: BaseModel) -> None:
    """A 400 naming the first field of `UNSUPPORTED_FIELDS` the request sets to a value
    that would change the output."""
    for name, harmless in UNSUPPORTED_FIELDS.items():
        value = getattr(request, name) if name in type(request).model_fields else (request.model_extra or {}).get(name)
        if value not in harmless:
            accepted = ", ".join(json.dumps(v) for v in harmless if v is not None)
            hint = f"; it accepts only {accepted}" if accepted else ""
            raise OpenAIError(f"{name} is not supported by this server yet{hint}.", 400, name)
