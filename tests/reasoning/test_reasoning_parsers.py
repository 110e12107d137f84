"""The reasoning parsers against vLLM 0.32's splits (the expected values were read off
vLLM's own parsers on the same texts), whole and streamed in every split."""

import pytest

from tests.helpers.tokenizer import make_tokenizer, text_ids
from vjx.reasoning import ReasoningDelta, ReasoningParserManager


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>", "<tool_call>"])
    return tokenizer


R1 = [
    ("abc", ("abc", None)),
    ("<think>abc</think>def", ("abc", "def")),
    ("abc</think>def", ("abc", "def")),
    ("<think>abc", ("abc", None)),
    ("abc</think>", ("abc", None)),
    ("pre<think>abc</think>def", ("abc", "def")),
    ("</think>x</think>y", (None, "x</think>y")),
    ("<think></think>", (None, None)),
    ("abc <tool_call>x", ("abc <tool_call>x", None)),
    ("a\n\n</think>\n\nb", ("a\n\n", "\n\nb")),
]
QWEN3 = [
    ("abc", ("abc", None)),
    ("<think>abc</think>def", ("abc", "def")),
    ("abc</think>def", ("abc", "def")),
    ("abc</think>", ("abc", None)),
    ("pre<think>abc</think>def", ("preabc", "def")),
    ("</think>x</think>y", (None, "xy")),
    ("<think></think>", (None, None)),
    ("abc <tool_call>x</tool_call>", ("abc ", "<tool_call>x</tool_call>")),
]


@pytest.mark.parametrize("name, cases", [("deepseek_r1", R1), ("qwen3", QWEN3)])
def test_extract_reasoning_splits_as_vllm(tokenizer, name, cases):
    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    for text, expected in cases:
        assert parser.extract_reasoning(text) == expected, text


def _stream(parser, tokenizer, pieces: list[str]) -> tuple[str, str]:
    """The reasoning and content a stream of `pieces` sends, joined."""
    reasoning, content, previous = "", "", ""
    for piece in pieces:
        delta = parser.extract_reasoning_streaming(previous, previous + piece, piece, [], [], [])
        assert delta is None or isinstance(delta, ReasoningDelta)
        if delta is not None:
            assert delta.reasoning or delta.content
            reasoning += delta.reasoning or ""
            content += delta.content or ""
        previous += piece
    return reasoning, content


def _splits(tokenizer, text: str) -> list[list[str]]:
    """The text one token at a time, two tokens at a time, and whole: the think tags are
    tokens, so a delta never splits one."""
    tokens = [tokenizer.decode([token_id]) for token_id in text_ids(tokenizer, text)]
    return [tokens, ["".join(tokens[i : i + 2]) for i in range(0, len(tokens), 2)], [text]]


@pytest.mark.parametrize("name, cases", [("deepseek_r1", R1), ("qwen3", QWEN3)])
def test_streamed_parts_add_up_to_the_whole_split(tokenizer, name, cases):
    cls = ReasoningParserManager.get_reasoning_parser(name)
    for text, (reasoning, content) in cases:
        if text.find("<think>") > 0 and name == "deepseek_r1":
            continue  # text before a late <think> was already sent as reasoning
        for pieces in _splits(tokenizer, text):
            assert _stream(cls(tokenizer), tokenizer, pieces) == (reasoning or "", content or ""), (text, pieces)


def test_is_reasoning_end_and_content_ids(tokenizer):
    parser = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tokenizer)
    ids = lambda text: text_ids(tokenizer, text)  # noqa: E731
    assert [
        parser.is_reasoning_end(ids(t)) for t in ("abc", "<think>abc</think>x", "abc</think>", "</think><think>")
    ] == [
        False,
        True,
        True,
        False,
    ]
    assert parser.is_reasoning_end_streaming(ids("abc</think>"), ids("</think>"))
    assert parser.extract_content_ids(ids("abc")) == [] and parser.extract_content_ids(ids("abc</think>")) == []
    assert parser.extract_content_ids(ids("<think>a</think>x")) == ids("x")
    assert parser.count_reasoning_tokens(ids("<think>abc</think>x")) == len(ids("abc"))


def test_qwen3_with_thinking_off_is_all_content(tokenizer):
    cls = ReasoningParserManager.get_reasoning_parser("qwen3")
    parser = cls(tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert parser.extract_reasoning("<think>a</think>b") == (None, "<think>a</think>b")
    assert parser.is_reasoning_end(text_ids(tokenizer, "abc"))
    on = cls(tokenizer)
    assert on.is_reasoning_end(text_ids(tokenizer, "abc <tool_call>")) and not on.is_reasoning_end([])


def test_a_tokenizer_without_think_tokens_is_refused_by_name():
    for name in ("deepseek_r1", "qwen3"):
        with pytest.raises(ValueError, match=f"reasoning_parser '{name}' needs '<think>' and '</think>'"):
            ReasoningParserManager.get_reasoning_parser(name)(make_tokenizer())


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(KeyError, match="Available parsers: deepseek_r1, qwen3"):
        ReasoningParserManager.get_reasoning_parser("nope")
