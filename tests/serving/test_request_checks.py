"""What a request is checked against before its handler runs, and what a failure inside the
server tells the client: the unsupported-field table refuses by name, internal errors
name no internals. No engine runs."""

import json
import logging

import pydantic
import pytest

from serving.errors import ENGINE_DEAD_MESSAGE, OpenAIError
from serving.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from serving.sse import error_event, to_openai_error
from serving.unsupported_fields import UNSUPPORTED_FIELDS, check_supported_fields
from vjx.engine.exceptions import EngineDeadError, EngineRequestError


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"logits_processors": ["my.module:Processor"]}, "logits_processors"),
    ],
)
def test_unsupported_fields_are_refused_by_name(fields, param):
    request = parse_request(
        ChatCompletionRequest, json.dumps({"messages": [{"role": "user", "content": "x"}], **fields}).encode()
    )
    with pytest.raises(OpenAIError) as error:
        check_supported_fields(request)
    assert (error.value.status_code, error.value.param) == (400, param)
    assert error.value.message.startswith(f"{param} is not supported by this server yet")


def test_harmless_values_and_metadata_are_accepted():
    harmless = {name: values[-1] for name, values in UNSUPPORTED_FIELDS.items()}
    body = {"prompt": "x", **harmless, "stream_options": {"continuous_usage_stats": False}}
    body.update(user="u", store=False, metadata={"k": "v"}, service_tier="auto")
    check_supported_fields(parse_request(CompletionRequest, json.dumps(body).encode()))
    with pytest.raises(pydantic.ValidationError):
        parse_request(CompletionRequest, b'{"prompt": "x", "n": "2"}')


def test_internal_errors_reach_the_log_not_the_client(caplog):
    secret = 'Traceback (most recent call last):\n  File "/srv/vjx/engine/core.py", line 1'
    with caplog.at_level(logging.ERROR, logger="serving.errors"):
        crash = to_openai_error(EngineRequestError("cmpl-7", secret), "cmpl-7")
        event = error_event(RuntimeError(secret), "chatcmpl-8")
    assert crash.status_code == 500 and crash.param is None
    assert crash.message == "The server failed on this request (request cmpl-7); see the server log."
    assert "/srv" not in event and "chatcmpl-8" in event
    assert [r.getMessage() for r in caplog.records] == [
        "Request cmpl-7 failed in the server.",
        "Request chatcmpl-8 failed in the server.",
    ]
    assert all(r.exc_info is not None for r in caplog.records)


def test_a_dead_engine_is_a_fixed_503_logged_once(caplog):
    death = EngineDeadError(f"EngineCore failed:\n{'x' * 10} /srv/vjx/worker.py")
    with caplog.at_level(logging.ERROR, logger="serving.errors"):
        errors = [to_openai_error(death) for _ in range(3)] + [OpenAIError.engine_dead(death)]
    assert {(e.status_code, e.message) for e in errors} == {(503, ENGINE_DEAD_MESSAGE)}
    assert [r.getMessage() for r in caplog.records] == [f"The engine is dead: {death}"]
