"""`vjx serve --enable-auto-tool-choice --tool-call-parser NAME` for `llama3_json`, `mistral`
and `pythonic` (hermes runs on the default model in test_structured_outputs.py), with the
official `openai` client, on a tiny random Llama whose tokenizer has each format's marker
tokens (`<|python_tag|>`, `[TOOL_CALLS]`, `[ARGS]`: the default model's lacks them).

"auto" parses the model's free text, which vLLM's `structured_outputs` fixes here to two calls
in the parser's format (a random model writes no calls of its own), checked whole and
streamed: the streamed deltas reassemble to the whole reply's calls and finish reason.
"required" and a named function do not go through the parser (the server holds them to its
JSON grammar and reads the JSON), so test_structured_outputs.py tests them once.
"""

import json
import re
import signal

import pytest

from tests.helpers.remote_server import RemoteServer
from tests.helpers.tiny_llama import save_tiny_llama
from tests.helpers.tokenizer import make_tokenizer
from tests.helpers.tool_stream import reassembled

TEMPLATE = (
    "{% for tool in tools or [] %}{{ tool.function.name }}\n{% endfor %}"
    "{% for m in messages %}{{ m.content }}\n{% endfor %}"
)
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "parameters": CITY}},
]
CALLS = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"city": "Lyon"}')]
REPLIES = {
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_time", "parameters": {"city": "Lyon"}}',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"city": "Lyon"}',
    "pythonic": '[get_weather(city="Paris"), get_time(city="Lyon")]',
}
"""Two calls in each parser's format, the text the "auto" requests are held to."""
CONSTRAINTS = {parser: {"regex": re.escape(reply)} for parser, reply in REPLIES.items() if parser != "llama3_json"} | {
    "llama3_json": {
        "grammar": "start: <|python_tag|> " + json.dumps(REPLIES["llama3_json"].removeprefix("<|python_tag|>"))
    }
}
"""vLLM's `structured_outputs` fixing each reply. llguidance takes a `<|...|>` token for a
special one, which a regex's text cannot match: a lark grammar names it as a token."""
REQUEST = dict(
    model="tiny",
    messages=[{"role": "user", "content": "Hello world"}],
    tools=TOOLS,
    temperature=1.0,
    seed=0,
    max_tokens=200,
)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-tool-caller")
    save_tiny_llama(path, num_kv_heads=2, vocab_size=304, max_position_embeddings=512)
    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]"])
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(REPLIES))
def served(request, model_path):
    """(the parser's name, its server's `openai` client)."""
    flags = ["--served-model-name", "tiny", "--enable-auto-tool-choice", "--tool-call-parser", request.param]
    remote = RemoteServer([str(model_path), *flags])
    yield request.param, remote.client()
    remote.stop(signal.SIGKILL)


def _whole_and_streamed(client, **fields) -> tuple[str, list[tuple[str, str]], str | None]:
    """The whole reply's (content, calls, finish reason), asserted equal to the stream's."""
    choice = client.chat.completions.create(**REQUEST, **fields).choices[0]
    calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or []]
    whole = (choice.message.content or "", calls, choice.finish_reason)
    assert reassembled(client.chat.completions.create(stream=True, **REQUEST, **fields)) == whole
    return whole


def test_auto_parses_the_parsers_format_whole_and_streamed(served):
    parser, client = served
    forced = {"structured_outputs": CONSTRAINTS[parser]}
    assert _whole_and_streamed(client, tool_choice="auto", extra_body=forced) == ("", CALLS, "tool_calls")
