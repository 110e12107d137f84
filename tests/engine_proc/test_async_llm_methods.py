"""AsyncLLM's utility methods (vLLM's async counterparts) against a real engine process, on
the tiny stand-in for the default model: the methods act on the engine, not on the model's
numbers, and its start-up and steps cost a fraction of the default model's."""

import asyncio
import os

import pytest

from tests.helpers.large_engine import PROMPTS
from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from tests.helpers.worker_rpc import worker_summary
from vjx import AsyncLLM, EngineArgs, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def engine(loop, tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    async_llm = AsyncLLM(EngineArgs(model=model, **TINY_DEFAULT_ARGS))
    yield async_llm
    async_llm.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))


def _run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT_S))


async def _tokens(engine: AsyncLLM, request_id: str) -> list[int]:
    tokens = []
    async for output in engine.generate(PROMPTS[0], GREEDY, request_id):
        tokens = output.outputs[0].token_ids
    return tokens


def test_sleep_wake_up_and_a_request_that_waits(loop, engine):
    reference = _run(loop, _tokens(engine, "ref"))
    _run(loop, engine.sleep(level=1))
    assert _run(loop, engine.is_sleeping()) is True

    async def generate_while_asleep():
        waiting = asyncio.ensure_future(_tokens(engine, "asleep"))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        assert await engine.wake_up() is True
        return await waiting

    assert _run(loop, generate_while_asleep()) == reference
    assert _run(loop, engine.is_sleeping()) is False


def test_collective_rpc_and_reset_prefix_cache(loop, engine):
    num_blocks = TINY_DEFAULT_ARGS["num_gpu_blocks_override"]
    assert _run(loop, engine.collective_rpc(worker_summary, args=("b",))) == [("b", num_blocks)]
    assert _run(loop, engine.reset_prefix_cache()) is True


def test_profile(loop, engine, tmp_path):
    _run(loop, engine.start_profile(profile_dir=str(tmp_path)))
    _run(loop, _tokens(engine, "profiled"))
    _run(loop, engine.stop_profile())
    assert any(f.endswith(".xplane.pb") for _, _, names in os.walk(tmp_path) for f in names)
