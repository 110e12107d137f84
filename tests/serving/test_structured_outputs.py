"""Structured outputs and tool calling through `vjx serve --enable-auto-tool-choice
--tool-call-parser hermes` and the official `openai` client, on the default model (one
server for both, to spare CI a start-up).

Structured outputs: every constrained answer follows its JSON schema, regex or choice, whole,
streamed or n at a time, next to unconstrained requests; a bad constraint is a 400. Tools:
forced choices ("required", a named function) whose JSON grammar the engine enforces, "auto"
parsing of the model's free text, streamed calls that reassemble to the whole reply's, and
the tools reaching the chat template.
"""

import asyncio
import json
import re
import signal

import jsonschema
import openai
import pydantic
import pytest

from serving.cli import main
from tests.helpers.json_schemas import random_schema
from tests.helpers.remote_server import RemoteServer
from tests.helpers.tool_stream import reassembled

NUM_SCHEMAS = 30
MAX_TOKENS = 160
PROMPT = "Answer with a JSON object."


@pytest.fixture(scope="module")
def server():
    flags = ["--served-model-name", "smollm2", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    remote = RemoteServer([*flags, "--trust-request-chat-template"])
    yield remote
    remote.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def _check(schema: dict, text: str) -> None:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    validator.validate(json.loads(text))


async def _gather(server, calls):
    async with server.async_client() as client:
        return await asyncio.gather(*(call(client) for call in calls))


def test_random_json_schemas_are_followed(server, model):
    schemas = [random_schema(seed) for seed in range(NUM_SCHEMAS)]

    def call(schema, seed):
        return lambda client: client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            response_format=_json_schema_format(schema),
            max_tokens=MAX_TOKENS,
            temperature=0.8,
            seed=seed,
        )

    responses = asyncio.run(_gather(server, [call(schema, seed) for seed, schema in enumerate(schemas)]))
    for schema, response in zip(schemas, responses, strict=True):
        choice = response.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        _check(schema, choice.message.content)


def test_n_choices_each_follow_the_schema(client, model):
    schema = random_schema(100)
    response = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        n=3,
        temperature=1.0,
        extra_body={"response_format": _json_schema_format(schema)},
    )
    assert len(response.choices) == 3
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice.text
        _check(schema, choice.text)


def test_a_streamed_answer_follows_the_schema(client, model):
    schema = random_schema(101)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        response_format=_json_schema_format(schema),
        max_tokens=MAX_TOKENS,
        stream=True,
    )
    pieces, finish_reasons = [], []
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish_reasons.append(choice.finish_reason)
    assert finish_reasons[-1] == "stop"
    _check(schema, "".join(pieces))


def test_json_object_regex_and_choice(client, model):
    json_object = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        response_format={"type": "json_object"},
        max_tokens=MAX_TOKENS,
    )
    assert isinstance(json.loads(json_object.choices[0].message.content), dict)
    pattern = r"[A-Z][a-z]{2,6}-[0-9]{2,4}"
    regex = client.completions.create(
        model=model,
        prompt="A code:",
        max_tokens=20,
        temperature=1.0,
        extra_body={"structured_outputs": {"regex": pattern}},
    )
    assert re.fullmatch(pattern, regex.choices[0].text), regex.choices[0].text
    choices = ["Paris", "London", "Berlin", "Madrid"]
    choice = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "The capital of Spain?"}],
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": choices}},
    )
    assert choice.choices[0].message.content in choices
    assert choice.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}}, None),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"structured_outputs": {"frobnicate": 1}}, "structured_outputs"),
        ({"structured_outputs": {"json": {"type": "object"}}, "use_beam_search": True, "n": 2}, "use_beam_search"),
    ],
)
def test_a_bad_constraint_is_a_400(server, model, body, param):
    status, raw = server.request("POST", "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 4, **body})
    response = json.loads(raw)
    assert status == 400, response
    if param is not None:
        assert response["error"]["param"] == param, response


def test_a_grammar_that_allows_no_token_ends_the_request_cleanly(server, client, model):
    # Matches only the empty string: at once the grammar allows nothing but EOS.
    response = client.completions.create(
        model=model, prompt="Hi", max_tokens=16, extra_body={"structured_outputs": {"regex": ""}}
    )
    assert response.choices[0].text == ""
    assert response.choices[0].finish_reason == "stop"
    assert server.request("GET", "/health")[0] == 200


def test_constrained_and_free_requests_run_together(server, model):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["n"],
        "additionalProperties": False,
    }

    def constrained(seed):
        return lambda client: client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            extra_body={"response_format": _json_schema_format(schema)},
        )

    def free(seed):
        return lambda client: client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=24, temperature=1.0, seed=seed
        )

    calls = [constrained(seed) for seed in range(32)] + [free(seed) for seed in range(8)]
    responses = asyncio.run(_gather(server, calls))
    for response in responses[:32]:
        assert response.choices[0].finish_reason == "stop", response.choices[0].text
        _check(schema, response.choices[0].text)
    assert all(response.choices[0].finish_reason == "length" for response in responses[32:])
    assert server.metrics()["vjx:num_requests_running"] == 0


def test_openai_client_parse_with_a_pydantic_model(client, model):
    class City(pydantic.BaseModel):
        name: str
        population: int

    completion = client.beta.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "A city as JSON."}],
        response_format=City,
        max_tokens=MAX_TOKENS,
    )
    assert isinstance(completion.choices[0].message.parsed, City)


def test_openai_errors_name_the_field(client, model):
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
        )


# Tool calling.

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": CITY},
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time in a city.", "parameters": CITY}},
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = dict(model="smollm2", messages=MESSAGES, tools=TOOLS, temperature=0.0, max_tokens=32)
"""Room for a forced call (`[{"name": "get_weather", "parameters": {"city": "Paris"}}]` is ~20 tokens)."""


def _calls(message) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or []]


def test_required_calls_a_tool_whole_and_streamed(client):
    # One call at most: greedy SmolLM2 would otherwise keep adding calls to the array.
    required = {**GREEDY, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 48}
    chat = client.chat.completions.create(**required)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""
    calls = _calls(choice.message)
    assert calls and all(name in ("get_weather", "get_time") for name, _ in calls)
    assert all(json.loads(arguments)["city"] in ("Paris", "Lyon") for _, arguments in calls)
    assert all(call.id.startswith("chatcmpl-tool-") and call.type == "function" for call in choice.message.tool_calls)
    stream = client.chat.completions.create(stream=True, **required)
    assert reassembled(stream) == ("", calls, "tool_calls")


def test_a_named_function_is_called_whole_and_streamed(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    chat = client.chat.completions.create(tool_choice=named, parallel_tool_calls=False, **GREEDY)
    choice = chat.choices[0]
    assert choice.finish_reason == "stop"
    [(name, arguments)] = _calls(choice.message)
    assert name == "get_time" and json.loads(arguments)["city"] in ("Paris", "Lyon")
    stream = client.chat.completions.create(tool_choice=named, stream=True, **GREEDY)
    assert reassembled(stream) == ("", [(name, arguments)], "stop")


def test_auto_parses_the_models_text_and_streams_the_same(client):
    auto = {**GREEDY, "max_tokens": 12}
    chat = client.chat.completions.create(tool_choice="auto", **auto)
    choice = chat.choices[0]
    calls = _calls(choice.message)
    assert choice.finish_reason == ("tool_calls" if calls else "length")
    streamed = reassembled(client.chat.completions.create(stream=True, **auto))
    assert streamed == (choice.message.content or "", calls, choice.finish_reason)


def test_auto_parses_hermes_calls_after_content(client):
    """vLLM's `structured_outputs` regex fixes the reply to text and two calls in Hermes's format."""
    reply = (
        'Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Lyon"}}\n</tool_call>'
    )
    forced = {**GREEDY, "max_tokens": 96, "extra_body": {"structured_outputs": {"regex": re.escape(reply)}}}
    chat = client.chat.completions.create(tool_choice="auto", **forced)
    choice = chat.choices[0]
    calls = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"city": "Lyon"}')]
    assert (choice.message.content, _calls(choice.message), choice.finish_reason) == ("Checking. ", calls, "tool_calls")
    assert reassembled(client.chat.completions.create(stream=True, **forced)) == ("Checking. ", calls, "tool_calls")


def test_the_tools_and_tool_messages_reach_the_chat_template(server, client):
    template = (
        "{% for tool in tools %}[{{ tool.function.name }}]{% endfor %}"
        "{% for m in messages %}{% if m.tool_calls %}<{{ m.tool_calls[0].function.arguments.city }}>{% endif %}"
        "{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
    ]
    chat = client.chat.completions.create(
        model="smollm2",
        messages=history,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=1,
        extra_body={"chat_template": template, "return_token_ids": True},
    )
    status, body = server.request("POST", "/detokenize", {"tokens": chat.prompt_token_ids})
    prompt = json.loads(body)["prompt"]
    assert prompt.startswith("[get_weather][get_time]user: What is the weather in Paris?\n<Lyon>assistant: ")
    assert "tool: Sunny" in prompt


def test_vllms_tool_choice_errors(server):
    cases = [
        ({"tools": []}, "tools", "`tools` must not be an empty array"),
        ({"tool_choice": "required"}, "tool_choice", "When using `tool_choice`, `tools` must be set."),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "does not",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, None, None),
    ]
    for fields, param, message in cases:
        status, body = server.request("POST", "/v1/chat/completions", {"messages": MESSAGES, **fields})
        error = json.loads(body)["error"]
        assert status == 400, body
        if param is not None:
            assert error["param"] == param and message in error["message"], error


def test_tool_flags_are_checked_before_the_engine_starts(capsys):
    assert main(["serve", "--enable-auto-tool-choice", "--tool-call-parser", "nope"]) == 2
    error = capsys.readouterr().err
    assert "tool_call_parser must be one of ['hermes', 'llama3_json', 'llama4_json', 'mistral', 'pythonic']" in error
    assert main(["serve", "--enable-auto-tool-choice"]) == 2
    assert "enable_auto_tool_choice requires tool_call_parser" in capsys.readouterr().err
