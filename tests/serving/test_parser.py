"""Parser and ParserManager (serving/parser.py): reasoning split first, tool calls read from
the content, the tool choice's rules and 400s, and streams that add up to whole replies."""

import json

import pytest

from serving.errors import OpenAIError
from serving.parser import ParserManager
from serving.protocol import ChatCompletionRequest
from tests.helpers.tokenizer import make_tokenizer, text_ids

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "get_time"}}
REPLY = (
    "<think>The user wants the time.</think>Checking. "
    '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
)


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])
    return tokenizer


def _request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def _stream(parser, tokenizer, text: str) -> dict:
    """The reasoning, content and calls a token-by-token stream of `text` sends."""
    sent = {"reasoning": "", "content": "", "tool_calls": {}}
    token_ids = text_ids(tokenizer, text)
    for i, token_id in enumerate(token_ids):
        delta = parser.parse_delta(tokenizer.decode([token_id]), [token_id], finished=i == len(token_ids) - 1)
        if delta is None:
            continue
        sent["reasoning"] += delta.reasoning or ""
        sent["content"] += delta.content or ""
        for call in delta.tool_calls or []:
            name, arguments = sent["tool_calls"].get(call.index, (None, ""))
            sent["tool_calls"][call.index] = (name or call.function.name, arguments + (call.function.arguments or ""))
    return sent


def test_reasoning_then_auto_tool_calls_whole_and_streamed(tokenizer):
    parsers = ParserManager(tokenizer, "deepseek_r1", "hermes")
    request = _request(tools=TOOLS)
    parsed = parsers.get_parser(request).parse(REPLY)
    assert parsed.reasoning == "The user wants the time." and parsed.content == "Checking. "
    assert [(c.function.name, c.function.arguments) for c in parsed.tool_calls] == [("get_time", '{"zone": "CET"}')]
    streamed = _stream(parsers.get_parser(request), tokenizer, REPLY)
    assert streamed == {
        "reasoning": "The user wants the time.",
        "content": "Checking. ",
        "tool_calls": {0: ("get_time", '{"zone": "CET"}')},
    }


def test_include_reasoning_false_and_a_prompt_that_ended_reasoning(tokenizer):
    parsers = ParserManager(tokenizer, "deepseek_r1")
    assert parsers.get_parser(_request(include_reasoning=False)).parse("a</think>b").reasoning is None
    parser = parsers.get_parser(_request())
    parser.set_prompt_token_ids(text_ids(tokenizer, "<think></think>"))
    assert (parser.parse("a b").reasoning, parser.parse("a b").content) == (None, "a b")
    assert parsers.get_parser(_request()).parse("a b").reasoning == "a b"


def test_forced_choices_use_the_json_grammar_and_read_it(tokenizer):
    parsers = ParserManager(tokenizer, "", "hermes")
    required = _request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert parsers.structured_outputs(required).json == {
        "type": "array",
        "minItems": 1,
        "maxItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {"name": {"type": "string", "enum": ["get_time"]}, "parameters": {"type": "object"}},
                    "required": ["name", "parameters"],
                }
            ],
        },
    }
    two = json.dumps([{"name": "get_time", "parameters": {"a": 1}}, {"name": "get_time", "parameters": {}}])
    parsed = parsers.get_parser(required).parse(two)
    assert [c.function.arguments for c in parsed.tool_calls] == ['{"a": 1}'] and parsed.content is None
    named = _request(tools=TOOLS, tool_choice=NAMED)
    assert parsers.structured_outputs(named).json == {"type": "object"}
    assert parsers.get_parser(named).parse('{"zone": "UTC"}').tool_calls[0].function.arguments == '{"zone": "UTC"}'
    assert parsers.structured_outputs(_request(tools=TOOLS)) is None
    assert parsers.adjust_request(_request(tools=TOOLS)).skip_special_tokens is False


def test_tool_choice_rules_are_vllms(tokenizer):
    without_auto = ParserManager(tokenizer)
    with_auto = ParserManager(tokenizer, "", "pythonic")
    cases = [
        (with_auto, _request(tools=[]), "`tools` must not be an empty array"),
        (with_auto, _request(tool_choice="auto"), "When using `tool_choice`, `tools` must be set."),
        (
            with_auto,
            _request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "x"}}),
            "does not match",
        ),
        (without_auto, _request(tools=TOOLS), '"auto" tool choice requires --enable-auto-tool-choice'),
        (without_auto, _request(tools=TOOLS, tool_choice="required"), 'tool_choice="required" requires --tool-call'),
        (without_auto, _request(tools=TOOLS, tool_choice=NAMED), 'tool_choice=function "get_time" requires'),
    ]
    for parsers, request, message in cases:
        with pytest.raises(OpenAIError, match=message) as raised:
            parsers.check_request(request)
        assert raised.value.status_code == 400
    without_auto.check_request(_request(tools=TOOLS, tool_choice="none"))
    assert without_auto.get_parser(_request(tools=TOOLS, tool_choice="none")) is None


def test_unknown_or_unusable_parsers_are_refused_at_start_up(tokenizer):
    with pytest.raises(ValueError, match="Available parsers: hermes, llama3_json, llama4_json, mistral, pythonic"):
        ParserManager.check_names("", "nope")
    with pytest.raises(ValueError, match="Available parsers: deepseek_r1, qwen3"):
        ParserManager(tokenizer, "nope")
    with pytest.raises(ValueError, match="--reasoning-parser qwen3 cannot be used with this model's tokenizer"):
        ParserManager(make_tokenizer(), "qwen3")
    with pytest.raises(ValueError, match="--tool-call-parser mistral cannot be used"):
        ParserManager(tokenizer, "", "mistral")
