"""A request's output constraint: OpenAI's `response_format` and vLLM's `structured_outputs`.

`response_format` (`text`, `json_object`, `json_schema`) takes precedence over the same
constraint in `structured_outputs`, whose other options (`disable_any_whitespace`, ...) still
apply, as vLLM merges them. Every constraint is compiled once here, so a bad schema, regex
or grammar is a 400 naming the field before the request reaches the engine.
"""

import dataclasses

from serving.errors import OpenAIError
from serving.protocol import ResponseFormat
from vjx.sampling_params import StructuredOutputsParams
from vjx.structured_output.backend_guidance import validate_structured_outputs


def structured_outputs_of(
    response_format: ResponseFormat | None, structured_outputs: dict | None
) -> StructuredOutputsParams | None:
    """The request's constraint, checked; None when it has none."""
    params = _from_structured_outputs(structured_outputs)
    param = "structured_outputs"
    if response_format is not None and response_format.type != "text":
        param = "response_format"
        overrides = _overrides(response_format)
        base = {} if params is None else dataclasses.asdict(params)
        base.update({name: None for name in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")})
        params = StructuredOutputsParams(**{**base, **overrides})
    if params is not None:
        try:
            validate_structured_outputs(params)
        except ValueError as e:
            raise OpenAIError(str(e).replace("structured_outputs", param, 1), 400, param) from None
    return params


def _from_structured_outputs(structured_outputs: dict | None) -> StructuredOutputsParams | None:
    if structured_outputs is None:
        return None
    try:
        return StructuredOutputsParams(**structured_outputs)
    except TypeError as e:
        raise OpenAIError(f"structured_outputs: {e}.", 400, "structured_outputs") from None
    except ValueError as e:
        raise OpenAIError(str(e), 400, "structured_outputs") from None


def _overrides(response_format: ResponseFormat) -> dict:
    if response_format.type == "json_object":
        return {"json_object": True}
    json_schema = response_format.json_schema
    if json_schema is None or json_schema.json_schema is None:
        raise OpenAIError(
            "When response_format type is 'json_schema', the 'json_schema' field (with its 'schema') must be provided.",
            400,
            "response_format",
        )
    schema = json_schema.json_schema
    # A boolean schema: true allows any JSON value; false allows none (refused by the compiler).
    return {"json": schema if isinstance(schema, dict) else ({} if schema else {"not": {}})}
