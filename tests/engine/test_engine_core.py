"""EngineCore's step around a scripted scheduler and executor (no model): the phases in
order, the profiler's view of them, `has_work` with steps in flight, and the seams the
clients use instead of reaching into the scheduler."""

import collections
import time

import pytest

from vjx.core.sched.output import CachedRequestData, SchedulerOutput
from vjx.engine.core import EngineCore
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs
from vjx.engine.step_profiler import NullStepProfiler, StepProfiler
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

_COLLECT_S = 0.01


class _Scheduler:
    """Runs `num_steps` steps of one request, logging every call."""

    def __init__(self, calls: list[str], num_steps: int):
        self.calls = calls
        self.num_steps_left = num_steps
        self.is_reset = False

    def has_unfinished_requests(self) -> bool:
        return self.num_steps_left > 0

    def has_finished_requests(self) -> bool:
        return False

    def schedule(self):
        self.calls.append("schedule")
        self.num_steps_left -= 1
        return SchedulerOutput([], CachedRequestData(["r"], [False], [None], [0]), {"r": 1}, 1, set())

    def update_from_output(self, scheduler_output, model_output: ModelRunnerOutput) -> EngineCoreOutputs:
        self.calls.append("update")
        return EngineCoreOutputs(outputs=[EngineCoreOutput("r", model_output.sampled_token_ids[0])])

    def reset_prefix_cache(self) -> bool:
        self.is_reset = True
        return True

    def has_structured_output_requests(self, scheduler_output) -> bool:
        return False

    def get_grammar_bitmask(self, scheduler_output) -> None:
        pass


class _Executor:
    """Dispatches at once; the step's tokens take `_COLLECT_S` to arrive."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def execute_model(self, scheduler_output, non_block: bool = False) -> AsyncModelRunnerOutput:
        assert non_block, "the engine collects the tokens itself"
        self.calls.append("execute")

        def collect() -> ModelRunnerOutput:
            self.calls.append("collect")
            time.sleep(_COLLECT_S)
            return ModelRunnerOutput(["r"], {"r": 0}, [[7]])

        return AsyncModelRunnerOutput(collect)


def _engine_core(num_steps: int, profiler=None) -> tuple[EngineCore, list[str]]:
    """An EngineCore around the scripted parts (start-up, which builds a model, skipped)."""
    calls: list[str] = []
    core = object.__new__(EngineCore)
    core.scheduler = _Scheduler(calls, num_steps)
    core.model_executor = _Executor(calls)
    core.batch_queue = collections.deque()
    core.batch_queue_size = 2
    core.profiler = profiler or NullStepProfiler()
    return core, calls


def test_step_runs_the_four_phases_in_order():
    core, calls = _engine_core(num_steps=1)
    outputs = core.step()
    assert calls == ["schedule", "execute", "collect", "update"]
    assert [(o.request_id, o.new_token_ids) for o in outputs.outputs] == [("r", [7])]
    assert core.step() == EngineCoreOutputs()
    assert calls == ["schedule", "execute", "collect", "update"], "no work, no phase"


def test_profiler_times_each_phase_and_counts_each_update():
    profiler = StepProfiler()
    core, _ = _engine_core(num_steps=2, profiler=profiler)
    core.step()
    core.step()
    means = profiler.means()
    assert profiler.num_steps == 2
    assert means["collect"] >= _COLLECT_S, "collect is waiting for the step's tokens"
    assert means["execute"] < _COLLECT_S, "dispatch does not wait for the tokens"
    assert means["host"] == means["schedule"] + means["execute"] + means["update"]


def test_batch_queue_dispatches_ahead_and_has_work_counts_it():
    profiler = StepProfiler()
    core, calls = _engine_core(num_steps=1, profiler=profiler)
    assert core.step_with_batch_queue() == EngineCoreOutputs(), "first step dispatched, not collected"
    assert calls == ["schedule", "execute"]
    assert not core.scheduler.has_unfinished_requests()
    assert core.has_work(), "a dispatched step's tokens are still to come"
    outputs = core.step_with_batch_queue()
    assert calls == ["schedule", "execute", "collect", "update"]
    assert [o.new_token_ids for o in outputs.outputs] == [[7]]
    assert not core.has_work()
    assert profiler.num_steps == 1


def test_reset_prefix_cache_goes_through_the_engine_core():
    core, _ = _engine_core(num_steps=0)
    assert core.reset_prefix_cache() is True
    assert core.scheduler.is_reset


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="phase must be one of"):
        StepProfiler().phase("sample")
