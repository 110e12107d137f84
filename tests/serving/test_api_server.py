"""The OpenAI API through the real `openai` client, against `vjx serve` in a subprocess.

One server for the module (the default SmolLM2 model), configured partly through a YAML
--config file (with vLLM's metric names: --metrics-prefix vllm); the SIGTERM drain test stops
it and so runs last.
"""

import json
import signal

import openai
import pytest
import yaml

from benchmarks.cli import main as bench_main
from tests.helpers.remote_server import RemoteServer
from tests.helpers.vllm_metrics import check_against_vllm, families_by_name

PROMPT = "The capital of France is"
GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "served-model-name": ["smollm2", "smol-alias"],
                "access-log": "json",
                "max_logprobs": 8,
                "metrics-prefix": "vllm",
            }
        )
    )
    remote = RemoteServer(["--config", str(config)])
    yield remote
    remote.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_completion(client):
    completion = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, **GREEDY)
    assert completion.model == "smollm2" and completion.object == "text_completion"
    choice = completion.choices[0]
    assert "Paris" in choice.text
    assert choice.finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        5,
        8,
        13,
    )


def test_alias_and_default_model_names(client):
    texts = [
        client.completions.create(model=name, prompt=PROMPT, max_tokens=4, **GREEDY).choices[0].text
        for name in ("smollm2", "smol-alias")
    ]
    assert texts[0] == texts[1]
    assert [m.id for m in client.models.list().data] == ["smollm2", "smol-alias"]


def test_batch_prompts_and_token_ids(client, server):
    prompts = [PROMPT, "def fibonacci(n):", "1, 2, 3, 4,"]
    batch = client.completions.create(model="smollm2", prompt=prompts, max_tokens=6, **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    singles = [
        client.completions.create(model="smollm2", prompt=p, max_tokens=6, **GREEDY).choices[0].text for p in prompts
    ]
    assert [c.text for c in batch.choices] == singles
    status, body = server.request("POST", "/tokenize", {"prompt": PROMPT})
    assert status == 200
    token_ids = json.loads(body)["tokens"]
    by_ids = client.completions.create(model="smollm2", prompt=token_ids, max_tokens=6, **GREEDY)
    assert by_ids.choices[0].text == singles[0]
    assert by_ids.usage.prompt_tokens == len(token_ids)
    nested = client.completions.create(model="smollm2", prompt=[token_ids, token_ids], max_tokens=6, **GREEDY)
    assert [c.text for c in nested.choices] == [singles[0]] * 2


def test_chat_with_string_and_content_parts(client):
    question = "What is the capital of France? Answer in one word."
    as_string = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": question}], max_completion_tokens=8, **GREEDY
    )
    parts = [{"type": "text", "text": question}]
    as_parts = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": parts}], max_tokens=8, **GREEDY
    )
    assert as_string.object == "chat.completion"
    message = as_string.choices[0].message
    assert message.role == "assistant" and "Paris" in message.content
    assert as_parts.choices[0].message.content == message.content
    assert as_string.usage.total_tokens == as_string.usage.prompt_tokens + as_string.usage.completion_tokens


def test_completion_stream_with_usage(client):
    whole = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=10, **GREEDY)
    chunks = list(
        client.completions.create(
            model="smollm2", prompt=PROMPT, max_tokens=10, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in text_chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == 5


def test_chat_stream_with_usage(client):
    messages = [{"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, **GREEDY)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_n2_seeded_and_reproducible(client):
    kwargs = dict(model="smollm2", prompt="Once upon a time", max_tokens=12, temperature=1.0, n=2, seed=123)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    other = client.completions.create(**{**kwargs, "seed": 7})
    assert sorted(c.index for c in first.choices) == [0, 1]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.choices[0].text != first.choices[1].text
    assert [c.text for c in first.choices] != [c.text for c in other.choices]
    assert first.usage.completion_tokens == 24
    chat = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4, seed=5
    )
    assert sorted(c.index for c in chat.choices) == [0, 1]


def test_logprobs(client):
    completion = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=5, logprobs=3, **GREEDY)
    logprobs = completion.choices[0].logprobs
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert len(logprobs.token_logprobs) == 5 and all(lp <= 0 for lp in logprobs.token_logprobs)
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == logprob
        assert logprob == max(top.values())  # greedy: the chosen token is the best one
    chat = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
    content = chat.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content
    assert all(len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == entry.logprob for entry in content)
    with pytest.raises(openai.BadRequestError, match="max_logprobs=8"):
        client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=2, logprobs=10)


def test_echo_with_logprobs(client):
    completion = client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=3, echo=True, logprobs=1, **GREEDY
    )
    choice = completion.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == 5 + 3
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp is not None for lp in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset[1] == len(logprobs.tokens[0])


def test_stop_strings(client):
    completion = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=16, stop=["."], **GREEDY)
    choice = completion.choices[0]
    assert choice.text == " Paris" and choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == "."
    kept = client.completions.create(
        model="smollm2",
        prompt=PROMPT,
        max_tokens=16,
        stop=["."],
        extra_body={"include_stop_str_in_output": True},
        **GREEDY,
    )
    assert kept.choices[0].text == " Paris."


def test_vllm_extra_sampling_fields(client):
    completion = client.completions.create(
        model="smollm2",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"13": -100},
        user="tester",
        seed=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "ignore_eos": True, "min_tokens": 12},
    )
    assert completion.usage.completion_tokens == 12 and completion.choices[0].finish_reason == "length"


def test_models_version_tokenize_detokenize(server):
    status, body = server.request("GET", "/version")
    assert status == 200 and "version" in json.loads(body)
    status, body = server.request("POST", "/tokenize", {"prompt": PROMPT, "return_token_strs": True})
    tokens = json.loads(body)
    assert status == 200 and tokens["count"] == 5 and tokens["max_model_len"] == 256
    assert len(tokens["token_strs"]) == 5
    status, body = server.request("POST", "/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200 and json.loads(body)["prompt"] == PROMPT
    status, body = server.request("POST", "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and json.loads(body)["count"] > 5


def test_metrics_are_vllms(server):
    status, body = server.request("GET", "/metrics")
    assert status == 200
    families = families_by_name(body.decode(), "vllm")
    check_against_vllm(families)
    assert not families_by_name(body.decode(), "vjx")
    model = {"model_name": "smollm2", "engine": "0"}
    [info] = families["cache_config_info"].samples
    assert info.value == 1 and (info.labels["block_size"], info.labels["engine"]) == ("16", "0")
    assert all(sample.labels.items() >= model.items() for sample in families["request_success"].samples)
    values = server.metrics()
    assert values["vllm:generation_tokens_total"] > 50 and values["vllm:prompt_tokens_total"] > 20
    assert values["vllm:time_to_first_token_seconds_count"] >= 10
    assert values["vllm:e2e_request_latency_seconds_count"] >= 10
    assert values["vllm:request_queue_time_seconds_count"] == values["vllm:e2e_request_latency_seconds_count"]
    assert values["vllm:inter_token_latency_seconds_count"] > 0
    assert values["vllm:prefix_cache_queries_total"] > 0
    assert values["vllm:kv_cache_usage_perc"] == 0.0 and values["vllm:num_requests_running"] == 0.0
    success = {
        s.labels["finished_reason"]: s.value for s in families["request_success"].samples if s.name.endswith("_total")
    }
    assert success["length"] >= 10 and set(success) == {"stop", "length", "abort", "error"}


def test_serve_benchmark_against_the_server(server, tmp_path):
    output = tmp_path / "serve.json"
    code = bench_main(
        [
            "serve",
            "--base-url",
            server.base_url,
            "--request-rate",
            "inf",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--output-json",
            str(output),
        ]
    )
    assert code == 0
    result = json.loads(output.read_text())
    assert result["served_model"] == "smollm2" and len(result["runs"]) == 1
    run = result["runs"][0]
    assert (run["completed"], run["failed"]) == (4, 0)
    assert run["output_throughput"] == pytest.approx(16 / run["duration_s"])
    assert 0 < run["ttft_ms"]["median"] <= run["e2e_latency_ms"]["median"]


def test_sigterm_drains_the_stream_in_flight(server, client):
    """Runs last: SIGTERM mid-stream; the stream still completes, then the server shuts down
    (uvicorn re-raises the signal once it has finished, as a process ended by SIGTERM)."""
    stream = client.completions.create(
        model="smollm2",
        prompt=PROMPT,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    first = next(iter(stream))
    server.process.send_signal(signal.SIGTERM)
    chunks = [first, *stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 40
    assert server.process.wait(60) in (0, -signal.SIGTERM)
    log = server.log_tail(200_000)
    assert "Application shutdown complete." in log
    assert '"path": "/v1/completions", "status": 200' in log
