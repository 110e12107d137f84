"""Structured outputs through `vjx serve` and the official `openai` client, on the default
model: every constrained answer follows its JSON schema, regex or choice, whole, streamed
or n at a time, next to unconstrained requests; a bad constraint is a 400."""

import asyncio
import json
import re

import jsonschema
import openai
import pydantic
import pytest

from tests.helpers.json_schemas import random_schema
from tests.helpers.remote_server import RemoteServer

NUM_SCHEMAS = 30
MAX_TOKENS = 160
PROMPT = "Answer with a JSON object."


@pytest.fixture(scope="module")
def server():
    remote = RemoteServer([])
    yield remote
    remote.stop()


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
