"""Bad, hostile and abandoned requests against `vjx serve` (an API key, a small body limit),
serving the tiny stand-in for the default model under the default model's name.

Each bad request must get its 4xx OpenAI error JSON within a second while a good stream
keeps running; 50 streams of which half are dropped must leave no KV block in use. The
engine-death test kills the engine process and so runs last.
"""

import asyncio
import json
import threading
import time

import psutil
import pytest

from tests.helpers.hostile_requests import SAMPLING_CASES, completion
from tests.helpers.remote_server import RemoteServer
from tests.helpers.tiny_default_model import save_tiny_default_model

pytestmark = pytest.mark.serial

API_KEY = "test-key-123"
MODEL = "SmolLM2-135M-Instruct"
"""The default served name of the embedded model."""
BODY_LIMIT = 64 * 1024
HEADER_LIMIT = 8 * 1024
GOOD = {"prompt": "Hello", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _completion(**changes) -> dict:
    return {**GOOD, **changes}


def _without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


def _chat(**changes) -> dict:
    return {**CHAT, **changes}


# (name, path, body, extra headers, status, param)
HOSTILE = [
    ("missing prompt", "/v1/completions", _without(GOOD, "prompt"), {}, 400, "prompt"),
    ("prompt of wrong type", "/v1/completions", _completion(prompt=5), {}, 400, "prompt"),
    ("empty prompt", "/v1/completions", _completion(prompt=""), {}, 400, "prompt"),
    ("empty prompt list", "/v1/completions", _completion(prompt=[]), {}, 400, "prompt"),
    ("empty token list", "/v1/completions", _completion(prompt=[[]]), {}, 400, "prompt"),
    ("negative token id", "/v1/completions", _completion(prompt=[1, -1]), {}, 400, None),
    ("token id out of vocab", "/v1/completions", _completion(prompt=[10**9]), {}, 400, None),
    ("prompt longer than max_model_len", "/v1/completions", _completion(prompt="hi " * 400), {}, 400, "prompt"),
    ("max_tokens a string", "/v1/completions", _completion(max_tokens="ten"), {}, 400, "max_tokens"),
    ("max_tokens negative", "/v1/completions", _completion(max_tokens=-5), {}, 400, "max_tokens"),
    ("max_tokens zero", "/v1/completions", _completion(max_tokens=0), {}, 400, "max_tokens"),
    ("max_tokens past max_model_len", "/v1/completions", _completion(max_tokens=10**6), {}, 400, "max_tokens"),
    ("max_tokens a float", "/v1/completions", _completion(max_tokens=2.5), {}, 400, "max_tokens"),
    ("temperature negative", "/v1/completions", _completion(temperature=-1), {}, 400, "temperature"),
    ("temperature a string", "/v1/completions", _completion(temperature="hot"), {}, 400, "temperature"),
    ("top_p zero", "/v1/completions", _completion(top_p=0), {}, 400, "top_p"),
    ("top_k negative", "/v1/completions", _completion(top_k=-5), {}, 400, "top_k"),
    ("n zero", "/v1/completions", _completion(n=0), {}, 400, "n"),
    ("n huge", "/v1/completions", _completion(n=100000), {}, 400, "n"),
    ("logprobs over 20", "/v1/completions", _completion(logprobs=21), {}, 400, "logprobs"),
    ("logprobs negative", "/v1/completions", _completion(logprobs=-1), {}, 400, "logprobs"),
    ("presence_penalty too big", "/v1/completions", _completion(presence_penalty=5), {}, 400, "presence_penalty"),
    ("repetition_penalty zero", "/v1/completions", _completion(repetition_penalty=0), {}, 400, "repetition_penalty"),
    ("logit_bias key not an id", "/v1/completions", _completion(logit_bias={"abc": 1}), {}, 400, "logit_bias"),
    # A bias past +-100 is clamped, as vLLM does (tests/serving/test_vllm_routes.py).
    ("logit_bias key a float", "/v1/completions", _completion(logit_bias={"5.5": 1}), {}, 400, "logit_bias"),
    ("seed past int64", "/v1/completions", _completion(seed=2**70), {}, 400, "seed"),
    ("empty stop string", "/v1/completions", _completion(stop=[""]), {}, 400, "stop"),
    ("stop a number", "/v1/completions", _completion(stop=123), {}, 400, "stop"),
    ("min_tokens over max_tokens", "/v1/completions", _completion(min_tokens=10), {}, 400, "min_tokens"),
    ("empty allowed_token_ids", "/v1/completions", _completion(allowed_token_ids=[]), {}, 400, "allowed_token_ids"),
    ("suffix", "/v1/completions", _completion(suffix="x"), {}, 400, "suffix"),
    ("best_of", "/v1/completions", _completion(best_of=3), {}, 400, "best_of"),
    ("body a JSON list", "/v1/completions", [GOOD], {}, 400, None),
    ("bad JSON", "/v1/completions", b'{"prompt": "Hi", "max_tokens": ', {}, 400, None),
    ("invalid UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe bad", "max_tokens": 4}', {}, 400, None),
    ("oversized body", "/v1/completions", _completion(prompt="x" * (2 * BODY_LIMIT)), {}, 400, None),
    ("oversized headers", "/v1/completions", GOOD, {"X-Big": "y" * (2 * HEADER_LIMIT)}, 400, None),
    ("unknown model", "/v1/completions", _completion(model="gpt-5"), {}, 404, "model"),
    ("missing API key", "/v1/completions", GOOD, {"Authorization": ""}, 401, None),
    ("wrong API key", "/v1/completions", GOOD, {"Authorization": "Bearer wrong"}, 401, None),
    ("wrong key on /metrics", "/metrics", None, {"Authorization": "Bearer wrong"}, 401, None),
    ("chat without messages", "/v1/chat/completions", _chat(messages=[]), {}, 400, "messages"),
    # Any role string is taken, as vLLM does (tests/serving/test_vllm_routes.py); a role that is
    # not a string is not.
    (
        "chat role not a string",
        "/v1/chat/completions",
        _chat(messages=[{"role": 5, "content": "x"}]),
        {},
        400,
        "messages",
    ),
    (
        "chat image part",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        {},
        400,
        "messages",
    ),
    (
        "chat top_logprobs over 20",
        "/v1/chat/completions",
        _chat(logprobs=True, top_logprobs=30),
        {},
        400,
        "top_logprobs",
    ),
    ("chat top_logprobs without logprobs", "/v1/chat/completions", _chat(top_logprobs=2), {}, 400, "top_logprobs"),
    (
        "chat max_completion_tokens too big",
        "/v1/chat/completions",
        _chat(max_completion_tokens=100000),
        {},
        400,
        "max_completion_tokens",
    ),
    ("chat unknown model", "/v1/chat/completions", _chat(model="nope"), {}, 404, "model"),
    ("tokenize neither prompt nor messages", "/tokenize", {"add_special_tokens": True}, {}, 400, None),
    ("detokenize negative id", "/detokenize", {"tokens": [-1]}, {}, 400, "tokens"),
    ("unknown route", "/v1/engines", GOOD, {}, 404, None),
    ("chat temperature NaN", "/v1/chat/completions", _chat(temperature=float("nan")), {}, 400, "temperature"),
    ("chat top_k of 2^64", "/v1/chat/completions", _chat(top_k=2**64), {}, 400, "top_k"),
    ("chat tools", "/v1/chat/completions", _chat(tools=[{"type": "function"}]), {}, 400, "tools"),
    ("chat n of 2^63", "/v1/chat/completions", _chat(n=2**63), {}, 400, "n"),
    ("detokenize id past int64", "/detokenize", {"tokens": [2**64]}, {}, 400, "tokens"),
]
SAMPLING = [
    (name, "/v1/completions", completion(**changes), {}, status, param)
    for name, changes, status, param, _ in SAMPLING_CASES
]
"""The shared table of sampling extremes (tests/helpers/hostile_requests.py): some must
run to completion (200), the rest get their 4xx."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    remote = RemoteServer(
        [
            model,
            "--served-model-name",
            MODEL,
            "--max-request-body-bytes",
            str(BODY_LIMIT),
            "--max-header-bytes",
            str(HEADER_LIMIT),
            "--access-log",
            "off",
        ],
        env={"VJX_API_KEY": API_KEY},
        api_key=API_KEY,
    )
    yield remote
    remote.stop()


def _check_error(status: int, body: bytes, expected_status: int, expected_param: str | None) -> None:
    assert status == expected_status, body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == expected_status and isinstance(error["message"], str) and error["message"]
    if expected_param is not None:
        assert error["param"] == expected_param, error


STREAM_TOKENS = 200
"""The good stream's length: it must outlast the hostile requests (60 tokens no longer did once
the CPU engine skipped the Gumbel draw for greedy batches)."""


def test_hostile_requests_get_fast_4xx_while_a_stream_runs(server):
    assert len(HOSTILE) >= 30
    client = server.client()
    result = {}

    def stream() -> None:
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt="Count to ten:",
                max_tokens=STREAM_TOKENS,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )
        result["finish_reason"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        result["usage"] = chunks[-1].usage

    thread = threading.Thread(target=stream)
    thread.start()
    time.sleep(0.5)
    slow = []
    for name, path, body, headers, expected_status, expected_param in HOSTILE:
        start = time.perf_counter()
        status, response = server.request("POST" if body is not None else "GET", path, body, headers)
        elapsed = time.perf_counter() - start
        _check_error(status, response, expected_status, expected_param)
        if elapsed >= 1.0:
            slow.append((name, elapsed))
    assert thread.is_alive(), "the good stream ended before the hostile requests did"
    thread.join(120)
    assert not slow
    assert result["finish_reason"] == "length" and result["usage"].completion_tokens == STREAM_TOKENS


def test_every_case_is_answered_in_time_and_the_engine_keeps_serving(server):
    """Each case of both tables: a refusal within a second, a request the engine runs (4
    tokens) within five. After each, /health (which fails once the engine is dead) answers
    200, and after each case the engine ran, a good request gets its 4 tokens; at the end
    nothing runs or holds KV."""
    cases = HOSTILE + SAMPLING
    assert len(cases) >= 80
    slow, broken = [], []
    for name, path, body, headers, expected_status, expected_param in cases:
        start = time.perf_counter()
        status, response = server.request("POST" if body is not None else "GET", path, body, headers)
        elapsed = time.perf_counter() - start
        if expected_status == 200:
            assert status == 200, (name, response)
        else:
            _check_error(status, response, expected_status, expected_param)
        if elapsed >= (5.0 if expected_status == 200 else 1.0):
            slow.append((name, round(elapsed, 2)))
        health_status, health = server.request("GET", "/health")
        if health_status != 200:
            broken.append((name, "/health", health_status, health[:200]))
        if expected_status == 200:
            good_status, good = server.request("POST", "/v1/completions", {**GOOD, "ignore_eos": True})
            if good_status != 200 or json.loads(good)["usage"]["completion_tokens"] != 4:
                broken.append((name, good_status, good[:200]))
    assert not slow and not broken, (slow, broken)
    metrics = _wait_until_idle(server)
    assert metrics["vjx:kv_cache_usage_perc"] == 0.0, metrics
    assert (metrics["vjx:num_requests_running"], metrics["vjx:num_requests_waiting"]) == (0.0, 0.0)


def test_health_needs_no_key_and_good_requests_still_work(server):
    assert server.request("GET", "/health", headers={"Authorization": ""})[0] == 200
    assert [m.id for m in server.client().models.list().data] == [MODEL]
    completion = server.client().completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert completion.usage.completion_tokens == 3


async def _stream_raw(server: RemoteServer, drop: bool) -> int:
    """One streamed completion over a raw socket: dropped after its first event, or read to
    `[DONE]`; returns the events read."""
    body = json.dumps(
        {"prompt": "Tell me a story.", "max_tokens": 150 if drop else 24, "stream": True, "ignore_eos": True}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    num_events = 0
    try:
        while line := await reader.readline():
            if line.startswith(b"data: "):
                num_events += 1
                if drop or line.startswith(b"data: [DONE]"):
                    break
    finally:
        writer.close()
    return num_events


def test_disconnect_storm_frees_every_block(server):
    async def storm():
        return await asyncio.gather(*[_stream_raw(server, drop=i % 2 == 0) for i in range(50)])

    num_events = asyncio.run(asyncio.wait_for(storm(), 240))
    assert all(n >= 1 for n in num_events)
    assert all(n >= 24 for n in num_events[1::2])
    metrics = _wait_until_idle(server)
    assert metrics["vjx:kv_cache_usage_perc"] == 0.0, metrics
    assert (metrics["vjx:num_requests_running"], metrics["vjx:num_requests_waiting"]) == (0.0, 0.0)
    # The dropped streams were aborted: none ran anywhere near its 150 tokens.
    assert metrics["vjx:generation_tokens_total"] < 25 * 24 + 25 * 40 + 200


def _wait_until_idle(server: RemoteServer, timeout_s: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = server.metrics()
        idle = (
            metrics["vjx:kv_cache_usage_perc"],
            metrics["vjx:num_requests_running"],
            metrics["vjx:num_requests_waiting"],
        ) == (0.0, 0.0, 0.0)
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def test_dropped_non_streaming_request_is_aborted(server):
    body = json.dumps({"prompt": "Tell me a story.", "max_tokens": 200, "ignore_eos": True}).encode()

    async def drop_after_start() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await asyncio.sleep(1.0)
        writer.close()

    before = server.metrics()["vjx:generation_tokens_total"]
    asyncio.run(drop_after_start())
    metrics = _wait_until_idle(server, timeout_s=3.0)
    assert metrics["vjx:kv_cache_usage_perc"] == 0.0 and metrics["vjx:num_requests_running"] == 0.0
    assert metrics["vjx:generation_tokens_total"] - before < 100


async def _stream_until_engine_dies(server: RemoteServer, engine) -> list[bytes]:
    """Streams a long completion, kills the engine after the first event, returns every event."""
    body = json.dumps({"prompt": "Tell me a story.", "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    events = []
    try:
        while line := await reader.readline():
            if line.startswith(b"data: "):
                events.append(line.strip())
                if len(events) == 1:
                    for process in engine:
                        process.kill()
                if line.startswith(b"data: [DONE]"):
                    break
    finally:
        writer.close()
    return events


def test_dead_engine_ends_streams_with_an_error_and_health_503(server):
    """Runs last: kills the server's engine process mid-stream."""
    engine = [
        p for p in psutil.Process(server.process.pid).children() if any("spawn_main" in part for part in p.cmdline())
    ]
    assert len(engine) == 1
    events = asyncio.run(asyncio.wait_for(_stream_until_engine_dies(server, engine), 60))
    assert events[-1] == b"data: [DONE]"
    error = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == 503 and "engine" in error["message"]
    assert len(events) < 100
    status, body = server.request("GET", "/health")
    _check_error(status, body, 503, None)
    status, body = server.request("POST", "/v1/completions", GOOD)
    _check_error(status, body, 503, None)
