"""Hostile peers on the engine's ZeroMQ sockets: real sockets, one real spawned engine.

A foreign process of the same user can reach every socket. What it sends lacks the
engine's token and is dropped with a warning (the engine stays alive and keeps serving);
it can receive nothing, since no socket of ours that sends is bound. A real DEAD message
logs its traceback at the front end and leaves a one-line `EngineDeadError`; it runs last,
as it marks the module's engine dead. The engine runs the tiny stand-in for the default
model (same tokenizer and vocabulary, two small layers): only its sockets are under test.
"""

import asyncio
import logging
import time
import types

import pytest
import zmq

from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from vjx import AsyncLLM, EngineArgs, SamplingParams
from vjx.engine import core_client, core_proc, serial
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vjx.sampling_params import RequestOutputKind

TIMEOUT_S = 120
WRONG_TOKEN = bytes(32)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, output_kind=RequestOutputKind.DELTA)
CONTROL_PROMPT = list(range(4000, 4008))
"""Eight fresh tokens (no full block, so no prefix cache hit): its one step schedules 8."""


@pytest.fixture(scope="module")
def async_llm(loop, tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    engine = AsyncLLM(EngineArgs(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False))
    yield engine
    engine.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))


@pytest.fixture
def context():
    zmq_context = zmq.Context()
    yield zmq_context
    zmq_context.destroy(linger=0)


def _run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT_S))


async def _collect(engine: AsyncLLM, request_id: str) -> list[int]:
    tokens = []
    async for output in engine.generate("The capital of France is", GREEDY, request_id):
        tokens += output.outputs[0].token_ids
    return tokens


async def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _intruder(context: zmq.Context, kind: int, address: str) -> zmq.Socket:
    socket = context.socket(kind)
    socket.connect(address)
    return socket


@pytest.fixture(scope="module")
def expected_tokens(async_llm, loop) -> list[int]:
    return _run(loop, _collect(async_llm, "reference"))


def test_forged_outputs_are_dropped_and_logged(async_llm, loop, context, expected_tokens, caplog):
    client = async_llm.engine_core
    failure = serial.encode_result(serial.EngineFailure("RuntimeError: forged", "Traceback: forged"))
    # A finished output for the running request: it would end the stream with wrong tokens.
    forged_outputs = serial.encode(
        WRONG_TOKEN, serial.OUTPUTS, EngineCoreOutputs([EngineCoreOutput("victim", [7], FinishReason.STOP)])
    )
    forged = [
        [b"garbage"],
        [serial.OUTPUTS, b"\x80"],
        forged_outputs,
        [serial.DEAD, failure],
        [WRONG_TOKEN, serial.DEAD, failure],
        [b"", serial.DEAD, failure],
        [client.engine.token, serial.OUTPUTS, b"\xc1"],
        [client.engine.token, serial.ADD, b"\x80"],
    ]
    intruder = _intruder(context, zmq.PUSH, client.engine.addresses["output"])

    async def scenario():
        victim = asyncio.create_task(_collect(async_llm, "victim"))
        await asyncio.sleep(0)
        with caplog.at_level(logging.WARNING, logger=serial.__name__):
            for frames in forged:
                intruder.send_multipart(frames)
            await _wait_for(lambda: client.output_drops.num_unlogged == len(forged) - 1)
        return await victim, await _collect(async_llm, "after")

    assert _run(loop, scenario()) == (expected_tokens, expected_tokens)
    assert not async_llm.errored and client.engine.is_alive()
    warnings = [r.getMessage() for r in caplog.records if r.name == serial.__name__]
    assert warnings == [
        "Dropped a message on the front end's output socket: message must be [token, kind, payload], got 1 frames."
    ]


def _engine_request(async_llm: AsyncLLM, request_id: str, max_tokens: int) -> EngineCoreRequest:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request, _ = async_llm.input_processor.process_inputs(request_id, {"prompt_token_ids": CONTROL_PROMPT}, params)
    return request


def test_forged_requests_never_run(async_llm, loop, context, expected_tokens):
    """The forged ADDs come before a correctly signed one on the same connection, so once
    that one ran, the engine has read (and dropped) them: only its 8 tokens were scheduled."""
    client = async_llm.engine_core
    forged = serial.encode(WRONG_TOKEN, serial.ADD, _engine_request(async_llm, "forged", 50))
    control = serial.encode(client.engine.token, serial.ADD, _engine_request(async_llm, "control", 1))
    intruder = _intruder(context, zmq.PUSH, client.engine.addresses["input"])

    async def scenario():
        totals = {"num_scheduled_tokens": 0, "num_steps": 0}
        await async_llm.get_stats()
        for frames in (forged[1:], [b"", *forged[1:]], forged, control):
            intruder.send_multipart(frames)
        while totals["num_steps"] == 0:
            stats = await async_llm.get_stats()
            for name in totals:
                totals[name] += getattr(stats, name)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        stats = await async_llm.get_stats()
        return totals, stats, await _collect(async_llm, "after")

    totals, stats, tokens = _run(loop, scenario())
    assert totals == {"num_scheduled_tokens": 8, "num_steps": 1}
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_steps) == (0, 0, 0)
    assert tokens == expected_tokens and not async_llm.errored


def test_no_socket_of_ours_sends_to_a_foreign_peer(async_llm, loop, context, expected_tokens):
    """A bound PUSH would deal requests out to any PULL connected to it; ours all connect."""
    addresses = async_llm.engine_core.engine.addresses
    thieves = [_intruder(context, zmq.PULL, address) for address in addresses.values()]

    async def scenario():
        return await asyncio.gather(*[_collect(async_llm, f"watched-{i}") for i in range(4)])

    assert _run(loop, scenario()) == [expected_tokens] * 4
    assert [thief.poll(100) for thief in thieves] == [0] * len(thieves)


def test_handshake_wait_drops_forged_messages(context, caplog):
    """No child is spawned: a stand-in that stays alive, and the test sends the READY."""
    engine = core_proc.EngineProcess(EngineArgs(**TINY_DEFAULT_ARGS))
    engine.process = types.SimpleNamespace(is_alive=lambda: True)
    handshake = context.socket(zmq.PULL)
    engine.bind(handshake, "handshake")
    ready = serial.EngineReady(400, 256, "ipc://elsewhere")
    sender = _intruder(context, zmq.PUSH, engine.addresses["handshake"])
    for frames in (
        serial.encode(WRONG_TOKEN, serial.READY, serial.EngineReady(1, 1, "tcp://attacker:1")),
        [serial.FAILED, serial.encode_result("forged")],
        serial.encode(engine.token, serial.OUTPUTS, serial.EngineReady(1, 1, "tcp://attacker:1")),
        serial.encode(engine.token, serial.READY, ready),
    ):
        sender.send_multipart(frames)
    try:
        with caplog.at_level(logging.WARNING, logger=serial.__name__):
            assert engine.wait_ready(handshake, 10.0) == ready
    finally:
        engine.shutdown()
    assert engine.addresses["input"] == "ipc://elsewhere"
    assert [r.getMessage() for r in caplog.records if r.name == serial.__name__] == [
        "Dropped a message on the handshake socket: message has a missing or wrong token."
    ]
    assert engine.handshake_drops.num_unlogged == 2


def test_dead_reason_is_one_short_line():
    assert (
        core_client.dead_reason("ValueError: " + "x" * 500 + "\nmore")
        == "EngineCore failed: ValueError: " + "x" * 185 + "..."
    )
    assert core_client.dead_reason("") == "EngineCore failed: unknown error"


def test_dead_message_logs_the_traceback_and_keeps_the_error_short(async_llm, loop, context, caplog):
    """Runs last: a correctly signed DEAD marks the module's engine dead."""
    client = async_llm.engine_core
    trace = 'Traceback (most recent call last):\n  File "/opt/vjx/engine/core.py", line 1\nRuntimeError: boom'
    failure = serial.EngineFailure("RuntimeError: boom in the step\nsecond line", trace)
    intruder = _intruder(context, zmq.PUSH, client.engine.addresses["output"])

    async def scenario():
        await async_llm.check_health()
        with caplog.at_level(logging.ERROR, logger=core_client.__name__):
            intruder.send_multipart(serial.encode(client.engine.token, serial.DEAD, failure))
            await _wait_for(lambda: async_llm.errored)

    _run(loop, scenario())
    assert str(client.dead_error) == "EngineCore failed: RuntimeError: boom in the step"
    assert [r.getMessage() for r in caplog.records if r.name == core_client.__name__] == [
        f"EngineCore failed; the engine process exits. Its traceback:\n{trace}"
    ]
