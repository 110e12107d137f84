"""The tool parsers: vLLM 0.32's reading of whole replies (the expected calls were read off
vLLM's own parsers where they agree), malformed replies as content, and streams that
reassemble to the whole reply's calls however the text is split into deltas."""

import json

import pytest

from serving.protocol import ChatCompletionRequest
from serving.tool_parsers import ToolParserManager
from serving.tool_parsers.streaming import NamedToolCallParser, RequiredToolCallParser
from tests.helpers.tokenizer import make_tokenizer

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
WEATHER = {"city": "Paris", "units": ["c", 1.5, None], "note": 'é "q"\n'}


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["<|python_tag|>", "[TOOL_CALLS]"])
    return tokenizer


@pytest.fixture(scope="module")
def v11_tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["[TOOL_CALLS]", "[ARGS]"])
    return tokenizer


def _request(tool_choice="auto") -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": tool_choice}
    )


def _calls(info) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in info.tool_calls]


def _stream(parser, text: str, pieces: list[str], request) -> tuple[str, list[tuple[str, str]], set]:
    """Content, calls (name, arguments) and ids a stream of `pieces` sends, reassembled."""
    content, calls, ids, previous = "", {}, set(), ""
    for piece in pieces:
        deltas = [parser.extract_tool_calls_streaming(previous, previous + piece, piece, [], [], [], request)]
        previous += piece
        deltas.append(parser.finish_streaming(previous, request) if previous == text else None)
        for delta in filter(None, deltas):
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.id is not None:
                    assert call.index not in calls and call.type == "function" and call.function.name
                    calls[call.index] = [call.function.name, ""]
                    ids.add(call.id)
                calls[call.index][1] += call.function.arguments or ""
    return content, [tuple(calls[index]) for index in sorted(calls)], ids


def _splits(text: str) -> list[list[str]]:
    return [list(text), [text[i : i + 3] for i in range(0, len(text), 3)], [text]]


def _check(parser_cls, tokenizer, text: str, calls: list, content, request=None):
    """The whole reply parses to `calls` and `content`; every stream of it sends the same."""
    request = request or _request()
    info = parser_cls(tokenizer, TOOLS).extract_tool_calls(text, request)
    assert (info.tools_called, _calls(info), info.content) == (bool(calls), calls, content), text
    for pieces in _splits(text):
        streamed_content, streamed_calls, ids = _stream(parser_cls(tokenizer, TOOLS), text, pieces, request)
        assert streamed_calls == calls, (text, pieces)
        assert len(ids) == len(calls)
        if not calls:
            assert streamed_content == text


def _args(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def test_hermes(tokenizer):
    hermes = ToolParserManager.get_tool_parser("hermes")
    call = '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(WEATHER) + "}\n</tool_call>"
    _check(hermes, tokenizer, "Let me look. " + call, [("get_weather", _args(WEATHER))], "Let me look. ")
    two = call + '<tool_call>{"name":"get_time","arguments":{}}</tool_call>'
    _check(hermes, tokenizer, two, [("get_weather", _args(WEATHER)), ("get_time", "{}")], None)
    _check(
        hermes, tokenizer, '<tool_call>{"name": "get_time", "arguments": {"z": 1}}', [("get_time", '{"z": 1}')], None
    )
    _check(hermes, tokenizer, "No tools today, 1 < 2 <tool", [], "No tools today, 1 < 2 <tool")
    malformed = '<tool_call>{"name": "get_time", "arguments": {nope}}</tool_call>'
    assert hermes(tokenizer, TOOLS).extract_tool_calls(malformed, _request()).content == malformed


def test_llama3_json(tokenizer):
    llama = ToolParserManager.get_tool_parser("llama3_json")
    text = '{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + "}"
    _check(llama, tokenizer, text, [("get_weather", _args(WEATHER))], None)
    two = '<|python_tag|>{"name": "get_weather", "arguments": {"a": 1}}; {"name": "get_time", "parameters": {}}'
    _check(llama, tokenizer, two, [("get_weather", '{"a": 1}'), ("get_time", "{}")], None)
    _check(llama, tokenizer, "Just text.", [], "Just text.")
    for malformed in ('{"name": "get_time"', '{"parameters": {}}', "{not json}"):
        assert llama(tokenizer, TOOLS).extract_tool_calls(malformed, _request()).content == malformed


def test_llama3_json_needs_the_python_tag():
    with pytest.raises(ValueError, match="tool_call_parser 'llama3_json' needs '<|python_tag|>'"):
        ToolParserManager.get_tool_parser("llama3_json")(make_tokenizer())


def test_pythonic(tokenizer):
    pythonic = ToolParserManager.get_tool_parser("pythonic")
    text = "[get_weather(city='Paris', units=['c', 1.5, None], note=\"é \\\"q\\\"\\n\"), get_time()]"
    _check(pythonic, tokenizer, text, [("get_weather", _args(WEATHER)), ("get_time", "{}")], None)
    _check(pythonic, tokenizer, "[get_time(zone=-1, ok=true)]", [("get_time", '{"zone": -1, "ok": true}')], None)
    for not_calls in ("Hello [world]", "[1, 2]", "[get_time(1)]", "[get_time(zone=f(x))]", "[get_time(zone="):
        assert pythonic(tokenizer, TOOLS).extract_tool_calls(not_calls, _request()).content == not_calls


def test_mistral_before_v11(tokenizer):
    mistral = ToolParserManager.get_tool_parser("mistral")
    text = 'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": ' + json.dumps(WEATHER) + "}]"
    _check(mistral, tokenizer, text, [("get_weather", _args(WEATHER))], "Sure. ")
    _check(mistral, tokenizer, '[TOOL_CALLS]{"name": "get_time", "arguments": "{}"}', [("get_time", "{}")], None)
    _check(mistral, tokenizer, "No [TOOL_CALL here", [], "No [TOOL_CALL here")
    info = mistral(tokenizer, TOOLS).extract_tool_calls("[TOOL_CALLS] nonsense", _request())
    assert (info.tools_called, info.content) == (False, "nonsense")
    ids = [call.id for call in mistral(tokenizer, TOOLS).extract_tool_calls(text, _request()).tool_calls]
    assert all(len(i) == 9 and i.isalnum() for i in ids)


def test_mistral_v11(v11_tokenizer):
    mistral = ToolParserManager.get_tool_parser("mistral")
    text = 'Hi [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time{}'
    _check(mistral, v11_tokenizer, text, [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")], "Hi ")
    _check(mistral, v11_tokenizer, '[TOOL_CALLS]get_time[ARGS]{"a":1} and more', [("get_time", '{"a":1}')], None)


def test_mistral_required_parses_the_bare_array_its_schema_forces(tokenizer):
    mistral = ToolParserManager.get_tool_parser("mistral")
    request = _request("required")
    schema = mistral(tokenizer, TOOLS).json_schema(request)
    assert schema["items"]["anyOf"][0]["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    text = '[{"name": "get_time", "arguments": {"zone": "CET"}}]'
    _check(mistral, tokenizer, text, [("get_time", '{"zone": "CET"}')], None, request)
    named = _request({"type": "function", "function": {"name": "get_time"}})
    assert mistral(tokenizer, TOOLS).json_schema(named)["maxItems"] == 1


def test_forced_choices_read_the_grammar_output(tokenizer):
    request = _request("required")
    text = (
        '[{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + '}, {"name": "get_time", "parameters": {}}]'
    )
    _check(
        RequiredToolCallParser, tokenizer, text, [("get_weather", _args(WEATHER)), ("get_time", "{}")], None, request
    )
    assert RequiredToolCallParser(tokenizer).extract_tool_calls("[{", request).tool_calls == []
    named = _request({"type": "function", "function": {"name": "get_time"}})
    parser = NamedToolCallParser(tokenizer, "get_time")
    assert _calls(parser.extract_tool_calls('{"zone": "CET"}', named)) == [("get_time", '{"zone": "CET"}')]
    assert _stream(NamedToolCallParser(tokenizer, "get_time"), "{}", ["{", "}"], named)[1] == [("get_time", "{}")]
