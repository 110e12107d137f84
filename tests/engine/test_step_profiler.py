"""StepProfiler: phase times per step, and the engine's `profile_host` wiring."""

import gc
import logging
import time

import pytest

from vjx.engine.step_profiler import PHASES, StepProfiler


def test_phases_accumulate_and_log_every_interval(caplog):
    profiler = StepProfiler(interval=2)

    def sleep(seconds):
        time.sleep(seconds)
        return seconds

    with caplog.at_level(logging.INFO, logger="vjx.engine.step_profiler"):
        for _ in range(4):
            with profiler.phase("execute"):
                assert sleep(0.01) == 0.01
            with profiler.phase("update"):
                pass
            profiler.step_done()
    means = profiler.means()
    assert profiler.num_steps == 4
    assert 0.01 <= means["execute"] < 0.05
    assert means["schedule"] == means["collect"] == 0.0
    assert means["host"] == means["execute"] + means["update"] <= means["wall"]
    assert sum("host profile over" in r.message for r in caplog.records) == 2


@pytest.fixture(scope="module")
def profiled_llm(tmp_path_factory):
    """One engine with `profile_host`, started with nothing frozen: any freeze seen is its own.
    It runs the tiny stand-in for the default model: the profile is of the host's work."""
    from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
    from vjx import LLM

    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    gc.unfreeze()
    return LLM(model=model, **TINY_DEFAULT_ARGS, profile_host=True)


def test_engine_profiles_every_step(profiled_llm):
    from tests.helpers.large_engine import PROMPTS
    from vjx import SamplingParams

    profiled_llm.generate(PROMPTS[:4], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    core = profiled_llm.llm_engine.engine_core.engine_core
    means = core.profiler.means()
    # One prefill step, then one decode step per further token (async scheduling may add a last
    # empty step).
    assert core.profiler.num_steps >= 8
    assert all(means[phase] > 0 for phase in PHASES)
    assert means["host"] < means["wall"]


def test_engine_start_up_freezes_the_heap(profiled_llm):
    """Full collections skip what start-up built: the engine core is in no GC generation."""
    core = profiled_llm.llm_engine.engine_core.engine_core
    assert gc.get_freeze_count() > 0
    assert not any(obj is core.scheduler for obj in gc.get_objects())
