"""vjx/chat_utils.py without an engine: message parsing, content formats, template kwargs."""

import pathlib

import pytest

from tests.helpers.tokenizer import make_tokenizer
from vjx import chat_utils

STRING_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)
PARTS_TEMPLATE = "{% for m in messages %}{% for part in m.content %}({{ part.text }}){% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def test_parse_message_in_both_formats():
    message = {"role": "user", "content": ["a", {"type": "text", "text": "b"}], "name": "n"}
    assert chat_utils.parse_message(message, "string") == {"role": "user", "content": "a\nb", "name": "n"}
    assert chat_utils.parse_message(message, "openai")["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    assert chat_utils.parse_message({"role": "assistant", "content": None}, "string")["content"] == ""


def test_content_format_detection():
    assert chat_utils.resolve_content_format(STRING_TEMPLATE, "auto") == "string"
    assert chat_utils.resolve_content_format(PARTS_TEMPLATE, "auto") == "openai"
    assert chat_utils.resolve_content_format(STRING_TEMPLATE, "openai") == "openai"


def test_render_matches_apply_chat_template(tokenizer):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    rendered = chat_utils.render_chat(
        tokenizer, messages, chat_template=STRING_TEMPLATE, chat_template_kwargs={"add_generation_prompt": True}
    )
    assert rendered == "<user>hi<a>"
    assert chat_utils.render_chat(tokenizer, messages, chat_template=PARTS_TEMPLATE) == "(hi)"


@pytest.mark.parametrize(
    ("messages", "kwargs", "match"),
    [
        ([{"role": "user", "content": [{"type": "input_audio"}]}], {}, "vjx serves text models"),
        ([{"role": "user", "content": [{"type": "text"}]}], {}, "needs a str text"),
        ([{"role": "user", "content": 3}], {}, "content must be"),
        ([{"role": "user", "content": "x"}], {"tokenize": True}, "cannot set"),
        (
            [{"role": "user", "content": "x"}],
            {"add_generation_prompt": True, "continue_final_message": True},
            "Cannot set both",
        ),
    ],
)
def test_bad_input_raises(tokenizer, messages, kwargs, match):
    with pytest.raises(ValueError, match=match):
        chat_utils.render_chat(tokenizer, messages, chat_template=STRING_TEMPLATE, chat_template_kwargs=kwargs)


def test_to_conversations():
    one = [{"role": "user", "content": "x"}]
    assert chat_utils.to_conversations(one) == [one]
    assert chat_utils.to_conversations([one, one]) == [one, one]
    with pytest.raises(ValueError, match="messages must be"):
        chat_utils.to_conversations([])


def test_load_chat_template_reads_a_file_or_takes_the_template(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(STRING_TEMPLATE)
    assert chat_utils.load_chat_template(path) == chat_utils.load_chat_template(str(path)) == STRING_TEMPLATE
    assert chat_utils.load_chat_template(STRING_TEMPLATE) == STRING_TEMPLATE
    assert chat_utils.load_chat_template("plain text\n") == "plain text\n"
    assert chat_utils.load_chat_template(None) is None


@pytest.mark.parametrize("template", ["no_such_template.jinja", pathlib.Path("{{ no such file }}")])
def test_load_chat_template_refuses_a_path_it_cannot_open(template):
    with pytest.raises(ValueError, match="chat_template .* looks like a file path, but it failed to be opened"):
        chat_utils.load_chat_template(template)
