"""Tool calling through `vjx serve --enable-auto-tool-choice --tool-call-parser hermes` and
the official `openai` client: forced choices ("required", a named function) whose JSON
grammar the engine enforces, "auto" parsing of the model's free text, streamed calls that
reassemble to the whole reply's, and the tools reaching the chat template.

One server for the module (the default SmolLM2 model). The forced-choice tests need the
engine's structured outputs (the grammar makes SmolLM2 write the calls).
"""

import json
import signal

import pytest

from serving.cli import main
from tests.helpers.remote_server import RemoteServer

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


@pytest.fixture(scope="module")
def server():
    remote = RemoteServer(
        [
            "--served-model-name",
            "smollm2",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--trust-request-chat-template",
        ]
    )
    yield remote
    remote.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _reassembled(stream) -> tuple[str, list[tuple[str, str]], str | None]:
    """A stream's content, its calls (name, arguments) put together, and its finish reason."""
    content, calls, finish_reason = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            if call.id is not None:
                assert call.type == "function" and call.index not in calls
                calls[call.index] = [call.function.name, ""]
            calls[call.index][1] += call.function.arguments or ""
        finish_reason = choice.finish_reason or finish_reason
    return content, [tuple(calls[index]) for index in sorted(calls)], finish_reason


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
    assert _reassembled(stream) == ("", calls, "tool_calls")


def test_a_named_function_is_called_whole_and_streamed(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    chat = client.chat.completions.create(tool_choice=named, parallel_tool_calls=False, **GREEDY)
    choice = chat.choices[0]
    assert choice.finish_reason == "stop"
    [(name, arguments)] = _calls(choice.message)
    assert name == "get_time" and json.loads(arguments)["city"] in ("Paris", "Lyon")
    stream = client.chat.completions.create(tool_choice=named, stream=True, **GREEDY)
    assert _reassembled(stream) == ("", [(name, arguments)], "stop")


def test_auto_parses_the_models_text_and_streams_the_same(client):
    auto = {**GREEDY, "max_tokens": 12}
    chat = client.chat.completions.create(tool_choice="auto", **auto)
    choice = chat.choices[0]
    calls = _calls(choice.message)
    assert choice.finish_reason == ("tool_calls" if calls else "length")
    streamed = _reassembled(client.chat.completions.create(stream=True, **auto))
    assert streamed == (choice.message.content or "", calls, choice.finish_reason)


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
