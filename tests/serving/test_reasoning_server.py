"""`vjx serve --reasoning-parser deepseek_r1` with the official `openai` client, on a tiny
random Llama whose tokenizer has `<think>` and `</think>` and whose chat template opens the
think block: the reply's reasoning and content are split, whole and streamed alike, and a
JSON schema constrains only the content after `</think>`.

A bias on `</think>` makes the random model close its think block after a few tokens (the
seed fixes where); the grammar then bans `</think>` like any token the schema does not allow.
"""

import json
import signal

import pytest

from tests.helpers.remote_server import RemoteServer
from tests.helpers.tiny_llama import save_tiny_llama
from tests.helpers.tokenizer import make_tokenizer

TEMPLATE = "{% for m in messages %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<think>{% endif %}"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-reasoner")
    save_tiny_llama(path, num_kv_heads=2, vocab_size=304, max_position_embeddings=512)
    tokenizer = make_tokenizer()
    # Added tokens that are not special, as in Qwen3's and DeepSeek-R1's tokenizers: the text keeps them.
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    remote = RemoteServer([str(path), "--served-model-name", "tiny", "--reasoning-parser", "deepseek_r1"])
    yield remote
    remote.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def end_think(server):
    status, body = server.request(
        "POST", "/tokenize", {"model": "tiny", "prompt": "</think>", "add_special_tokens": False}
    )
    [token_id] = json.loads(body)["tokens"]
    return token_id


def _request(end_think: int, **extra) -> dict:
    return dict(
        model="tiny",
        messages=[{"role": "user", "content": "Hello world"}],
        max_tokens=48,
        temperature=1.0,
        seed=0,
        logit_bias={str(end_think): 4.0},
        **extra,
    )


def test_reasoning_and_constrained_content_whole_and_streamed(server, end_think):
    client = server.client()
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    chat = client.chat.completions.create(**_request(end_think, response_format=response_format))
    message = chat.choices[0].message
    reasoning = message.model_extra["reasoning"]
    assert reasoning, "the seed makes the model reason for a few tokens first"
    assert "</think>" not in reasoning and "</think>" not in message.content
    assert json.loads(message.content)["answer"] in ("yes", "no")
    assert chat.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(stream=True, **_request(end_think, response_format=response_format))
    streamed_reasoning, streamed_content = "", ""
    for chunk in stream:
        for choice in chunk.choices:
            streamed_reasoning += (choice.delta.model_extra or {}).get("reasoning") or ""
            streamed_content += choice.delta.content or ""
    assert (streamed_reasoning, streamed_content) == (reasoning, message.content)


def test_without_a_constraint_the_think_block_is_split_off(server, end_think):
    chat = server.client().chat.completions.create(**_request(end_think))
    message = chat.choices[0].message
    assert message.model_extra["reasoning"]
    assert not message.content.startswith("</think>")
