"""EngineCore in its own process: real spawned children and ipc sockets, on CPU.

The module shares one AsyncLLM; the engine-death test kills it and so runs last. Its engines
run the tiny stand-in for the default model (same tokenizer and vocabulary, two small layers):
what is checked is the process boundary, and each start-up and decode step is then a fraction
of the default model's.
"""

import asyncio
import multiprocessing
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import zmq

from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from vjx import LLM, AsyncLLM, EngineArgs, SamplingParams
from vjx.engine.core_client import SyncMPClient
from vjx.engine.exceptions import EngineDeadError, EngineRequestError
from vjx.sampling_params import RequestOutputKind

PROMPTS = ["Hello, my name is", "The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
DELTA = RequestOutputKind.DELTA
TIMEOUT_S = 120


def _engine_children() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name == "VjxEngineCore"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))


@pytest.fixture(scope="module")
def async_llm(model, loop):
    engine = AsyncLLM(EngineArgs(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False))
    yield engine
    engine.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))


def _run(loop, coro, timeout_s: float = TIMEOUT_S):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout_s))


async def _collect(engine: AsyncLLM, prompt, params: SamplingParams, request_id: str) -> list[int]:
    tokens = []
    async for output in engine.generate(prompt, params, request_id):
        tokens += output.outputs[0].token_ids
    return tokens


def _greedy(kind: RequestOutputKind = RequestOutputKind.CUMULATIVE) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=12, output_kind=kind)


def test_outputs_identical_in_process_and_multiprocess(model, async_llm, loop):
    sampled = SamplingParams(temperature=0.8, seed=5, max_tokens=10)
    in_process = LLM(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False, multiprocess=False)
    expected = [
        [o.outputs[0].token_ids for o in in_process.generate(PROMPTS, p, use_tqdm=False)] for p in (_greedy(), sampled)
    ]
    in_process.shutdown()
    multiprocess = LLM(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False, multiprocess=True)
    try:
        got = [
            [o.outputs[0].token_ids for o in multiprocess.generate(PROMPTS, p, use_tqdm=False)]
            for p in (_greedy(), sampled)
        ]
    finally:
        client = multiprocess.llm_engine.engine_core
        multiprocess.llm_engine.shutdown()
    assert got == expected
    assert not client.engine.process.is_alive() and client.engine.process.exitcode is not None
    assert not os.path.exists(client.engine.socket_dir)

    async def streams():
        return await asyncio.gather(
            *[_collect(async_llm, p, _greedy(DELTA), f"same-{i}") for i, p in enumerate(PROMPTS)]
        )

    assert _run(loop, streams()) == expected[0]


def test_n_greater_than_one_streams_as_one_request(async_llm, loop):
    params = SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=6, ignore_eos=True)

    async def last_output():
        async for output in async_llm.generate(PROMPTS[0], params, "parallel"):
            last = output
        return last

    last = _run(loop, last_output())
    assert last.finished and [len(c.token_ids) for c in last.outputs] == [6, 6]


def test_handshake_reports_blocks_and_max_model_len(async_llm):
    ready = async_llm.engine_core.ready
    assert (ready.num_gpu_blocks, ready.max_model_len) == (400, 256)


def test_32_streams_with_cancellations_free_every_block(async_llm, loop):
    rng = random.Random(0)

    async def scenario():
        tasks = []
        for i in range(32):
            params = SamplingParams(temperature=0.8, seed=i, max_tokens=rng.randint(4, 60), output_kind=DELTA)
            tasks.append(asyncio.create_task(_collect(async_llm, PROMPTS[i % 4], params, f"stream-{i}")))
        cancelled = rng.sample(range(32), 12)
        for i in cancelled:
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            tasks[i].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return cancelled, results, await async_llm.get_stats()

    cancelled, results, stats = _run(loop, scenario())
    for i, result in enumerate(results):
        if not isinstance(result, asyncio.CancelledError):
            assert isinstance(result, list) and result, (i, result)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) >= 1
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    assert not async_llm.request_queues and not async_llm.output_processor.has_unfinished_requests()


def test_abort_and_closing_a_stream_free_blocks(async_llm, loop):
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True, output_kind=DELTA)

    async def scenario():
        stream = async_llm.generate(PROMPTS[0], params, "closed")
        first = await stream.__anext__()
        await stream.aclose()
        outputs = []

        async def consume():
            async for output in async_llm.generate(PROMPTS[1], params, "aborted"):
                outputs.append(output)
                if len(outputs) == 2:
                    await async_llm.abort("aborted")

        await consume()
        return first, outputs, await async_llm.get_stats()

    first, outputs, stats = _run(loop, scenario())
    assert first.outputs[0].token_ids and len(outputs) == 2
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)


def test_bad_request_fails_alone(async_llm, loop, monkeypatch):
    process_inputs = async_llm.input_processor.process_inputs

    def empty_prompt_for_bad(request_id, *args, **kwargs):
        request, text = process_inputs(request_id, *args, **kwargs)
        if request_id == "bad":
            request.prompt_token_ids = []
        return request, text

    monkeypatch.setattr(async_llm.input_processor, "process_inputs", empty_prompt_for_bad)

    async def scenario():
        good = asyncio.create_task(_collect(async_llm, PROMPTS[0], _greedy(DELTA), "good"))
        with pytest.raises(EngineRequestError, match="'bad'.*must have 1 to max_model_len"):
            await _collect(async_llm, PROMPTS[1], _greedy(DELTA), "bad")
        return await good

    assert len(_run(loop, scenario())) == 12
    assert not async_llm.errored


def test_malformed_messages_do_not_kill_the_engine(async_llm, loop):
    expected = _run(loop, _collect(async_llm, PROMPTS[2], _greedy(DELTA), "before"))
    context = zmq.Context()
    intruder = context.socket(zmq.PUSH)
    intruder.connect(async_llm.engine_core.engine.addresses["input"])
    # Signed with the engine's token, so they reach the kind and payload checks.
    token = async_llm.engine_core.engine.token
    for frames in (
        [token, b"garbage"],
        [token, b"ADD", b"\xc1\xc1"],
        [token, b"ADD", b"\x93\x01\x02\x03"],
        [token, b"UTILITY", b"\x80"],
        [token, b"ABORT", b"\x91\x01"],
        [token, b"OUTPUTS", b"\x90"],
        [token, b"\x80\x04pickle", b"."],
    ):
        intruder.send_multipart(frames)
    intruder.close(linger=2000)
    context.term()
    assert _run(loop, _collect(async_llm, PROMPTS[2], _greedy(DELTA), "after")) == expected
    assert async_llm.engine_core.engine.is_alive()


def _listening_ips(*pids: int) -> list[str]:
    ips = []
    for pid in pids:
        process = psutil.Process(pid)
        connections = getattr(process, "net_connections", process.connections)(kind="inet")
        ips += [c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN]
    return ips


def test_no_socket_listens_beyond_loopback(async_llm):
    engine = async_llm.engine_core.engine
    assert all(address.startswith("ipc://") for address in engine.addresses.values())
    assert stat.S_IMODE(os.stat(engine.socket_dir).st_mode) == 0o700
    listening = _listening_ips(os.getpid(), engine.process.pid)
    assert all(ip in ("127.0.0.1", "::1") for ip in listening), listening


def test_tcp_transport_binds_loopback_only(model):
    with pytest.raises(ValueError, match="transport must be one of"):
        SyncMPClient(EngineArgs(model=model, **TINY_DEFAULT_ARGS), transport="udp")
    client = SyncMPClient(EngineArgs(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False), transport="tcp")
    try:
        assert all(address.startswith("tcp://127.0.0.1:") for address in client.engine.addresses.values())
        assert client.make_stats().num_running_reqs == 0
        listening = _listening_ips(os.getpid(), client.engine.process.pid)
        assert listening.count("127.0.0.1") >= 2 and set(listening) == {"127.0.0.1"}, listening
    finally:
        client.shutdown()
    assert not client.engine.process.is_alive()
    with pytest.raises(EngineDeadError):
        client.make_stats()


def test_start_up_failure_reports_the_child_error():
    before = len(_engine_children())
    with pytest.raises(RuntimeError, match="max_model_len must be in"):
        SyncMPClient(EngineArgs(max_model_len=10**7))
    assert len(_engine_children()) == before


_ORPHAN_SCRIPT = textwrap.dedent("""
    import threading, time, zmq
    from vjx.engine.core_proc import EngineProcess
    from vjx.engine_args import EngineArgs

    if __name__ == "__main__":
        engine = EngineProcess(EngineArgs(max_model_len=256, num_gpu_blocks_override=400))
        threading.Thread(target=engine.start, args=(zmq.Context(), 600.0), daemon=True).start()
        while engine.process is None or engine.process.pid is None:
            time.sleep(0.01)
        print(engine.process.pid, engine.socket_dir, flush=True)
        time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_child_exits_when_its_parent_is_killed(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid, socket_dir = parent.stdout.readline().split()
        child_pid = int(pid)
        time.sleep(1.0)
        assert not _gone(child_pid)
    finally:
        parent.kill()
        parent.wait(10)
    # A killed parent cannot remove its socket dir; nothing else is left behind.
    shutil.rmtree(socket_dir, ignore_errors=True)
    deadline = time.monotonic() + 30
    while not _gone(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _gone(child_pid):
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the engine process outlived its killed parent")


def test_killed_engine_raises_engine_dead_error_everywhere(async_llm, loop):
    """Runs last: it kills the module's engine."""
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True, output_kind=DELTA)

    async def scenario():
        streams = [async_llm.generate(p, params, f"doomed-{i}") for i, p in enumerate(PROMPTS)]
        for stream in streams:
            await stream.__anext__()
        os.kill(async_llm.engine_core.engine.process.pid, signal.SIGKILL)
        start = time.monotonic()

        async def drain(stream):
            async for _ in stream:
                pass

        results = await asyncio.wait_for(asyncio.gather(*[drain(s) for s in streams], return_exceptions=True), 5)
        return results, time.monotonic() - start

    results, elapsed = _run(loop, scenario())
    assert all(isinstance(r, EngineDeadError) for r in results), results
    assert str(results[0]) == "The engine process exited (exit code -9)."
    assert elapsed < 5 and async_llm.errored
    with pytest.raises(EngineDeadError):
        _run(loop, _collect(async_llm, PROMPTS[0], _greedy(DELTA), "after-death"))
    with pytest.raises(EngineDeadError):
        _run(loop, async_llm.get_stats())
    async_llm.shutdown()
    assert not async_llm.engine_core.engine.process.is_alive()
    assert not _engine_children()
