"""vLLM's own routes and request fields, through the real `openai` client and raw HTTP,
against `vjx serve` started with vLLM's opt-in flags (tokenizer info, prompt token
details, request chat templates, load tracking).

One server for the module, on the tiny stand-in for the default model (served under the
default model's name; the routes are the server's, not the model's): /ping, /load, /v1/models/{model}, /tokenizer_info,
/invocations and the /v1/embeddings refusal; prompt logprobs, scoring with
`echo` and `max_tokens=0`, beam search, token ids in choices and logprobs, continuous
usage, truncation sides, request chat templates, cached prompt tokens and the 400s vLLM
answers for bad combinations.
"""

import asyncio
import json
import re
import time

import openai
import pytest
import transformers

from serving.errors import OpenAIError
from serving.server_args import ServerArgs
from serving.serving_engine import OpenAIServing
from tests.helpers.remote_server import RemoteServer
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx.models import default_model

MODEL = "SmolLM2-135M-Instruct"
"""The default served name of the embedded model."""
FLAGS = [
    *("--enable-tokenizer-info-endpoint", "--enable-prompt-tokens-details"),
    *("--trust-request-chat-template", "--enable-server-load-tracking", "--access-log", "off"),
]
PROMPT = "The capital of France is"
GREEDY = dict(model=MODEL, temperature=0.0)
CHAT = [{"role": "user", "content": "Name a color."}]
NOT_JSON = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
"""vLLM's message (its RequestValidationError handler's)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    remote = RemoteServer([model, "--served-model-name", MODEL, *FLAGS])
    yield remote
    remote.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _error(status: int, body: bytes, expected_status: int) -> dict:
    assert status == expected_status, body
    return json.loads(body)["error"]


def _prompt_ids(server, text: str, add_special_tokens: bool = True) -> list[int]:
    status, body = server.request("POST", "/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
    assert status == 200, body
    return json.loads(body)["tokens"]


def test_ping_load_and_model_card(server, client):
    assert server.request("GET", "/ping")[0] == 200 and server.request("POST", "/ping")[0] == 200
    assert json.loads(server.request("GET", "/load")[1]) == {"server_load": 0}
    card = client.models.retrieve(MODEL)
    assert (card.id, card.object, card.model_extra["max_model_len"]) == (MODEL, "model", 256)
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("no-such-model")
    assert raised.value.body["param"] == "model" and "no-such-model" in raised.value.body["message"]


def test_load_counts_a_stream_until_it_ends(server, client):
    stream = client.completions.create(prompt=PROMPT, max_tokens=64, stream=True, **GREEDY)
    next(iter(stream))
    assert _load(server) == 1
    for _ in stream:
        pass
    deadline = time.monotonic() + 5.0
    while _load(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _load(server) == 0


def _load(server) -> int:
    status, body = server.request("GET", "/load")
    assert status == 200, body
    return json.loads(body)["server_load"]


def test_tokenizer_info(server):
    status, body = server.request("GET", "/tokenizer_info")
    info = json.loads(body)
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model.get_default_model_path())
    assert status == 200 and info["tokenizer_class"] == type(tokenizer).__name__
    assert info["chat_template"] == tokenizer.chat_template and "vocab_file" not in info
    assert info["eos_token"] == tokenizer.eos_token


def test_invocations_dispatch_on_the_body(server):
    status, body = server.request("POST", "/invocations", {"messages": CHAT, "max_tokens": 2})
    assert status == 200 and json.loads(body)["object"] == "chat.completion"
    status, body = server.request("POST", "/invocations", {"prompt": PROMPT, "max_tokens": 2})
    assert status == 200 and json.loads(body)["object"] == "text_completion"
    error = _error(*server.request("POST", "/invocations", {"input": "x"}), 400)
    assert error["message"].startswith("Cannot find suitable handler for request")


def test_embeddings_and_non_json_bodies_are_400s(server, client):
    with pytest.raises(openai.BadRequestError, match="does not support embeddings"):
        client.embeddings.create(model=MODEL, input="x")
    body = json.dumps({"prompt": PROMPT}).encode()
    for path in ("/v1/completions", "/v1/chat/completions", "/invocations"):
        for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/jsonl; charset=utf-8"}):
            error = _error(*server.request("POST", path, body, headers=headers), 400)
            assert error == {"message": NOT_JSON, "type": "invalid_request_error", "param": None, "code": 400}


def test_completion_prompt_logprobs(server, client):
    ids = _prompt_ids(server, PROMPT)
    choice = client.completions.create(prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 2}, **GREEDY)
    prompt_logprobs = choice.choices[0].model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for token_id, position in zip(ids[1:], prompt_logprobs[1:]):
        assert str(token_id) in position and 2 <= len(position) <= 3
        assert all(set(lp) == {"logprob", "rank", "decoded_token"} and lp["logprob"] <= 0 for lp in position.values())


def test_chat_prompt_logprobs(server, client):
    chat = client.chat.completions.create(
        messages=CHAT, max_tokens=2, extra_body={"prompt_logprobs": 1, "return_token_ids": True}, **GREEDY
    )
    prompt_ids, prompt_logprobs = chat.model_extra["prompt_token_ids"], chat.model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == len(prompt_ids) == chat.usage.prompt_tokens and prompt_logprobs[0] is None
    assert all(str(token_id) in position for token_id, position in zip(prompt_ids[1:], prompt_logprobs[1:]))


def test_echo_with_max_tokens_0_scores_the_prompt(server, client):
    ids = _prompt_ids(server, PROMPT)
    completion = client.completions.create(prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, **GREEDY)
    choice = completion.choices[0]
    assert choice.text == PROMPT and len(choice.logprobs.tokens) == len(ids)
    assert choice.logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (len(ids), 0)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be at least 1"):
        client.completions.create(prompt=PROMPT, max_tokens=0, **GREEDY)


def test_beam_search_completions_and_chat(client):
    beams = {"use_beam_search": True, "return_token_ids": True}
    completion = client.completions.create(prompt=PROMPT, n=3, max_tokens=4, extra_body=beams, **GREEDY)
    texts = [choice.text for choice in completion.choices]
    num_tokens = [len(choice.model_extra["token_ids"]) for choice in completion.choices]
    assert len(texts) == len(set(texts)) == 3 and all(1 <= n <= 4 for n in num_tokens)
    assert completion.usage.completion_tokens == sum(num_tokens)
    chat = client.chat.completions.create(messages=CHAT, n=2, max_tokens=3, extra_body=beams, **GREEDY)
    assert len({choice.message.content for choice in chat.choices}) == 2
    with pytest.raises(openai.BadRequestError, match="Streaming is not currently supported with beam search"):
        client.completions.create(prompt=PROMPT, stream=True, extra_body=beams, **GREEDY)


def test_return_token_ids_whole_and_streamed(server, client):
    extra = {"extra_body": {"return_token_ids": True}}
    completion = client.completions.create(prompt=PROMPT, max_tokens=4, **extra, **GREEDY).choices[0]
    assert completion.model_extra["prompt_token_ids"] == _prompt_ids(server, PROMPT)
    assert len(completion.model_extra["token_ids"]) == 4
    chat = client.chat.completions.create(messages=CHAT, max_tokens=4, **extra, **GREEDY)
    chunks = list(client.chat.completions.create(messages=CHAT, max_tokens=4, stream=True, **extra, **GREEDY))
    assert chunks[0].model_extra["prompt_token_ids"] == chat.model_extra["prompt_token_ids"]
    streamed = [t for chunk in chunks for c in chunk.choices for t in c.model_extra.get("token_ids") or []]
    assert streamed == chat.choices[0].model_extra["token_ids"] and len(streamed) == 4


def test_return_tokens_as_token_ids(client):
    extra = {"return_tokens_as_token_ids": True, "return_token_ids": True}
    choice = client.completions.create(prompt=PROMPT, max_tokens=3, logprobs=2, extra_body=extra, **GREEDY).choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.model_extra["token_ids"]]
    assert all(re.fullmatch(r"token_id:\d+", key) for top in choice.logprobs.top_logprobs for key in top)
    chat = client.chat.completions.create(
        messages=CHAT, max_tokens=3, logprobs=True, top_logprobs=2, extra_body=extra, **GREEDY
    ).choices[0]
    assert [lp.token for lp in chat.logprobs.content] == [f"token_id:{t}" for t in chat.model_extra["token_ids"]]


def test_continuous_usage_stats(client):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(prompt=PROMPT, max_tokens=4, stream=True, stream_options=options, **GREEDY))
    counts = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices]
    assert counts == [1, 2, 3, 4] and chunks[-1].usage.completion_tokens == 4 and not chunks[-1].choices
    chat = list(
        client.chat.completions.create(messages=CHAT, max_tokens=3, stream=True, stream_options=options, **GREEDY)
    )
    assert [chunk.usage.completion_tokens for chunk in chat if chunk.choices] == [0, 1, 2, 3]


def test_truncation_sides(client):
    prompt = list(range(100, 110))
    for side, kept in (("left", prompt[-3:]), ("right", prompt[:3]), (None, prompt[-3:])):
        extra = {"truncate_prompt_tokens": 3, "truncation_side": side, "return_token_ids": True}
        choice = client.completions.create(prompt=prompt, max_tokens=1, extra_body=extra, **GREEDY).choices[0]
        assert choice.model_extra["prompt_token_ids"] == kept, side


def test_request_chat_template_and_kwargs_and_custom_roles(server, client):
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ suffix }}\n{% endfor %}"
    chat = client.chat.completions.create(
        messages=[{"role": "narrator", "content": "Once"}, {"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body={"chat_template": template, "chat_template_kwargs": {"suffix": "!"}, "return_token_ids": True},
        **GREEDY,
    )
    assert chat.model_extra["prompt_token_ids"] == _prompt_ids(server, "narrator: Once!\nuser: Hi!\n", False)
    custom = client.chat.completions.create(messages=[{"role": "narrator", "content": "Once"}], max_tokens=2, **GREEDY)
    assert custom.choices[0].message.role == "assistant"


def test_an_untrusted_request_chat_template_is_refused():
    serving = object.__new__(OpenAIServing)
    serving.server_args = ServerArgs()
    for fields in ({"chat_template": "{{ x }}"}, {"chat_template_kwargs": {"chat_template": "{{ x }}"}}):
        with pytest.raises(OpenAIError, match="--trust-request-chat-template is not set") as raised:
            asyncio.run(serving.render_chat(CHAT, True, **fields))
        assert raised.value.status_code == 400


def test_cached_prompt_tokens(client):
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    first = client.completions.create(prompt=prompt, max_tokens=1, **GREEDY).usage
    second = client.completions.create(prompt=prompt, max_tokens=1, **GREEDY).usage
    assert first.prompt_tokens_details.cached_tokens < second.prompt_tokens_details.cached_tokens
    assert second.prompt_tokens_details.cached_tokens >= second.prompt_tokens - 16


def test_refused_combinations_name_their_field(server):
    cases = [
        ({"prompt": PROMPT, "stream_options": {"include_usage": True}}, "stream_options", "Stream options"),
        ({"prompt": PROMPT, "stream": True, "prompt_logprobs": 1}, "prompt_logprobs", "not available"),
        ({"prompt": PROMPT, "logit_bias": {"a": 1, "7": 1, "b c": 2, "--7": 1}}, "logit_bias", "['a', 'b c', '--7']"),
        ({"prompt": PROMPT, "logit_bias": {"-1": 1, "7": 1, "99999999": 2}}, "logit_bias", "[-1, 99999999]"),
    ]
    for body, param, message in cases:
        error = _error(*server.request("POST", "/v1/completions", body), 400)
        assert error["param"] == param and message in error["message"], error


def test_what_vllm_accepts_and_vjx_did_not(client):
    """Empty stream options without `stream`; logit_bias keys as Python's int() reads them, and
    biases past +-100 (clamped)."""
    client.completions.create(prompt=PROMPT, max_tokens=1, stream_options={}, **GREEDY)
    bias = {"+1000": 150.0, " 1001 ": -1e6, "1_002": 1.0}
    completion = client.completions.create(
        prompt=PROMPT, max_tokens=2, logit_bias=bias, extra_body={"return_token_ids": True}, **GREEDY
    )
    assert completion.choices[0].model_extra["token_ids"] == [1000, 1000]
