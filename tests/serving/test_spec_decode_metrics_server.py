"""A response's `metrics.speculative_decoding` (vLLM's --per-request-spec-decode-metrics), through
the real `openai` client against `vjx serve` with n-gram speculation on the tiny stand-in for the
default model: on chat and completion responses, a stream's usage chunk only, and never for a
response of several sequences."""

import json

import pytest

from tests.helpers.remote_server import RemoteServer
from tests.helpers.tiny_default_model import save_tiny_default_model

MODEL = "SmolLM2-135M-Instruct"
K = 3
FLAGS = [
    *("--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1})),
    *("--per-request-spec-decode-metrics", "detailed", "--access-log", "off"),
    # test_ngram_engine.py's engine shapes, so the compiled steps come from the persistent cache.
    *("--max-num-seqs", "8", "--max-num-batched-tokens", "32", "--enable-chunked-prefill"),
    *("--num-gpu-blocks-override", "40"),
]
MESSAGES = [{"role": "user", "content": "one two three four one two three four one two three four"}]
GREEDY = dict(model=MODEL, max_tokens=32, temperature=0.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    remote = RemoteServer([model, "--served-model-name", MODEL, *FLAGS])
    yield remote
    remote.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _check_figures(metrics: dict) -> dict:
    figures = metrics["speculative_decoding"]
    accepted, drafted = figures["per_step_accepted"], figures["per_step_drafted"]
    assert figures["num_spec_tokens"] == K and figures["num_spec_steps"] == len(accepted) == len(drafted) > 0
    assert figures["acceptance_histogram"] == [accepted.count(j) for j in range(K + 1)]
    assert figures["num_accepted_draft_tokens"] == sum(accepted) and figures["num_draft_tokens"] == sum(drafted)
    assert figures["mean_acceptance_length"] == pytest.approx(1 + sum(accepted) / len(accepted))
    return figures


def test_a_chat_completion_carries_its_figures_whole_and_streamed(client):
    whole = client.chat.completions.create(messages=MESSAGES, **GREEDY)
    figures = _check_figures(whole.model_extra["metrics"])
    chunks = list(
        client.chat.completions.create(messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY)
    )
    assert all("metrics" not in chunk.model_extra for chunk in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The same greedy request, alone on the engine: the same drafts, accepted alike.
    assert _check_figures(chunks[-1].model_extra["metrics"]) == figures


def test_a_completion_carries_its_figures_for_one_sequence_only(client):
    prompt = MESSAGES[0]["content"]
    _check_figures(client.completions.create(prompt=prompt, **GREEDY).model_extra["metrics"])
    two_prompts = client.completions.create(prompt=[prompt, prompt], **GREEDY)
    two_sequences = client.chat.completions.create(messages=MESSAGES, **{**GREEDY, "temperature": 1.0, "n": 2})
    assert two_prompts.model_extra["metrics"] is None and two_sequences.model_extra["metrics"] is None
    chunks = list(
        client.completions.create(prompt=prompt, stream=True, stream_options={"include_usage": True}, **GREEDY)
    )
    assert all("metrics" not in chunk.model_extra for chunk in chunks[:-1])
    _check_figures(chunks[-1].model_extra["metrics"])
