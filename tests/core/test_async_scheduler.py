"""AsyncScheduler: step N+1 is planned before step N's tokens are back.

Hand-built runner outputs check the placeholders step by step; a fake runner that keeps
tokens as the device would then checks that async and sync scheduling give the same
outputs through chunked prefill, prefix hits, preemptions and stops.
"""

import collections

import pytest

from tests.helpers.scheduler import (
    BLOCK_SIZE,
    free_ids,
    make_request,
    make_scheduler,
    new_reqs,
    num_free_blocks,
    output,
    runner_output,
)
from vjx.core.request import RequestStatus
from vjx.core.sched.async_scheduler import AsyncScheduler
from vjx.core.sched.output import CachedRequestData, SchedulerOutput
from vjx.core.sched.scheduler import Scheduler
from vjx.engine.messages import EngineCoreOutputs, FinishReason
from vjx.outputs import ModelRunnerOutput


def update(scheduler, out, sampled):
    return scheduler.update_from_output(out, runner_output(out, sampled))


def test_the_next_step_computes_the_placeholder_of_the_token_in_flight():
    scheduler = make_scheduler(async_scheduling=True)
    request = make_request("a", [1, 2, 3, 4, 5], max_tokens=3)
    scheduler.add_request(request)
    out1 = scheduler.schedule()
    assert out1.num_scheduled_tokens == {"a": 5}
    assert scheduler.num_output_placeholders == {"a": 1}

    # Step 2 computes the token that step 1 is sampling, at position 5.
    out2 = scheduler.schedule()
    assert out2.scheduled_cached_reqs == CachedRequestData(["a"], [False], [None], [5])
    assert out2.num_scheduled_tokens == {"a": 1}
    assert (request.num_computed_tokens, request.num_tokens) == (6, 5)
    assert scheduler.num_output_placeholders == {"a": 2}
    assert update(scheduler, out1, {"a": [7]}).outputs == [output("a", [7])]
    assert scheduler.num_output_placeholders == {"a": 1}

    out3 = scheduler.schedule()
    assert out3.scheduled_cached_reqs == CachedRequestData(["a"], [False], [None], [6])
    assert update(scheduler, out2, {"a": [8]}).outputs == [output("a", [8])]
    # Its third and last token is in flight: a fourth step would be wasted.
    out4 = scheduler.schedule()
    assert out4.total_num_scheduled_tokens == 0
    engine_outputs = update(scheduler, out3, {"a": [9]})
    assert engine_outputs == EngineCoreOutputs([output("a", [9], FinishReason.LENGTH)], {"a"})
    assert request.output_token_ids == [7, 8, 9]
    assert (scheduler.num_output_placeholders, num_free_blocks(scheduler)) == ({}, 16)
    assert scheduler.schedule().finished_req_ids == {"a"}


def test_stop_on_eos_while_the_next_step_is_scheduled_drops_its_token():
    scheduler = make_scheduler(async_scheduling=True)
    scheduler.add_request(make_request("a", [1, 2, 3], eos_token_id=2))
    scheduler.add_request(make_request("b", [4, 5, 6]))
    out1 = scheduler.schedule()
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens == {"a": 1, "b": 1}
    engine_outputs = update(scheduler, out1, {"a": [2], "b": [7]})
    assert engine_outputs == EngineCoreOutputs([output("a", [2], FinishReason.STOP), output("b", [7])], {"a"})
    # a's blocks are free before step 2 even ran; step 3 tells the runner to drop it.
    assert free_ids(scheduler) == list(range(3, 17)) + [1]
    out3 = scheduler.schedule()
    assert out3.finished_req_ids == {"a"}
    assert out3.num_scheduled_tokens == {"b": 1}
    engine_outputs = update(scheduler, out2, {"a": [9], "b": [8]})
    assert engine_outputs == EngineCoreOutputs([output("b", [8])], set())
    assert scheduler.requests["b"].output_token_ids == [7, 8]


def test_a_partial_prefill_samples_no_placeholder():
    scheduler = make_scheduler(async_scheduling=True, max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", [1, 2, 3, 4, 5, 6]))
    out1 = scheduler.schedule()
    assert scheduler.num_output_placeholders == {}
    out2 = scheduler.schedule()
    assert (out1.num_scheduled_tokens, out2.num_scheduled_tokens) == ({"a": 4}, {"a": 2})
    assert scheduler.num_output_placeholders == {"a": 1}
    assert update(scheduler, out1, {}).outputs == []
    out3 = scheduler.schedule()
    assert out3.scheduled_cached_reqs == CachedRequestData(["a"], [False], [None], [6])
    assert update(scheduler, out2, {"a": [7]}).outputs == [output("a", [7])]


def test_max_model_len_in_flight_schedules_no_wasted_step():
    scheduler = make_scheduler(async_scheduling=True, max_model_len=16)
    scheduler.add_request(make_request("a", list(range(14)), max_tokens=None))
    out1, out2 = scheduler.schedule(), scheduler.schedule()
    assert out2.num_scheduled_tokens == {"a": 1}
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    assert update(scheduler, out1, {"a": [5]}).outputs == [output("a", [5])]
    assert update(scheduler, out2, {"a": [6]}).outputs == [output("a", [6], FinishReason.LENGTH)]


def test_a_request_preempted_with_a_token_in_flight_gets_it_and_can_stop_while_waiting():
    scheduler = make_scheduler(async_scheduling=True, num_gpu_blocks=5, max_model_len=16, max_num_batched_tokens=16)
    a = make_request("a", [10, 11, 12, 13, 14, 15, 16, 17], max_tokens=3)
    b = make_request("b", [20, 21, 22, 23, 24, 25, 26, 27], eos_token_id=2)
    c = make_request("c", [30, 31, 32, 33, 34, 35, 36, 37], max_tokens=2)
    for request in (a, b, c):
        scheduler.add_request(request)
    out1 = scheduler.schedule()
    assert new_reqs(out1) == [("a", ([1, 2],), 0), ("b", ([3, 4],), 0)]
    # a and b both need a third block for their placeholders: b preempts itself.
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens == {"a": 1}
    assert (b.status, b.num_computed_tokens) == (RequestStatus.PREEMPTED, 0)
    assert scheduler.num_output_placeholders == {"a": 2, "b": 1}
    # b's token lands while it waits, and it is EOS: b finishes from the waiting queue.
    engine_outputs = update(scheduler, out1, {"a": [40], "b": [2]})
    assert engine_outputs == EngineCoreOutputs([output("a", [40]), output("b", [2], FinishReason.STOP)], {"b"})
    assert [r.request_id for r in scheduler.waiting] == ["c"]
    assert scheduler.num_output_placeholders == {"a": 1}
    out3 = scheduler.schedule()
    assert out3.finished_req_ids == {"b"}
    assert out3.num_scheduled_tokens == {"a": 1}
    assert new_reqs(out3) == []


def test_a_preempted_request_resumes_once_its_token_in_flight_is_back():
    scheduler = make_scheduler(async_scheduling=True, num_gpu_blocks=5, max_model_len=16, max_num_batched_tokens=16)
    a = make_request("a", [10, 11, 12, 13, 14, 15, 16, 17], max_tokens=2)
    b = make_request("b", [20, 21, 22, 23, 24, 25, 26, 27], max_tokens=2)
    scheduler.add_request(a)
    scheduler.add_request(b)
    out1 = scheduler.schedule()
    out2 = scheduler.schedule()
    assert b.status is RequestStatus.PREEMPTED
    update(scheduler, out1, {"a": [40], "b": [50]})
    # a's last token is in flight and b does not fit yet: nothing to run.
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    assert update(scheduler, out2, {"a": [41]}).finished_requests == {"a"}
    # b comes back with the token that was in flight when it was preempted.
    out4 = scheduler.schedule()
    assert out4.scheduled_cached_reqs == CachedRequestData(["b"], [True], [([3, 4, 2],)], [4])
    assert out4.num_scheduled_tokens == {"b": 5}
    assert scheduler.num_output_placeholders == {"b": 1}
    engine_outputs = update(scheduler, out4, {"b": [51]})
    assert engine_outputs.outputs == [output("b", [51], FinishReason.LENGTH)]
    assert b.output_token_ids == [50, 51]


def test_abort_with_two_steps_in_flight_frees_blocks_at_once():
    scheduler = make_scheduler(async_scheduling=True)
    scheduler.add_request(make_request("a", [1, 2, 3, 4, 5]))
    out1, out2 = scheduler.schedule(), scheduler.schedule()
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert (num_free_blocks(scheduler), scheduler.num_output_placeholders) == (16, {})
    assert update(scheduler, out1, {"a": [7]}) == EngineCoreOutputs([], {"a"})
    assert update(scheduler, out2, {"a": [8]}) == EngineCoreOutputs([], set())


EOS = 5


def fake_next_token(token_ids: list[int]) -> int:
    """A deterministic stand-in for the model: the next token depends on every token before."""
    return (sum((i + 3) * t for i, t in enumerate(token_ids)) + len(token_ids)) % 13 + 1


class FakeRunner:
    """Keeps each request's tokens as the device would, checking every diff it applies.

    It samples right away, so when the next step is planned the device already holds the
    token that the scheduler only counts as a placeholder.
    """

    def __init__(self) -> None:
        self.token_ids: dict[str, list[int]] = {}
        self.block_ids: dict[str, list[int]] = {}
        self.num_computed_tokens: dict[str, int] = {}

    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in out.finished_req_ids:
            self.token_ids.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.token_ids[new.req_id] = list(new.prompt_token_ids)
            self.block_ids[new.req_id] = list(new.block_ids[0])
            self.num_computed_tokens[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            resumed = cached.resumed_from_preemption[i]
            assert resumed or self.num_computed_tokens[req_id] == cached.num_computed_tokens[i]
            new_block_ids = cached.new_block_ids[i][0] if cached.new_block_ids[i] else []
            self.block_ids[req_id] = (self.block_ids[req_id] if not resumed else []) + new_block_ids
            self.num_computed_tokens[req_id] = cached.num_computed_tokens[i]
        sampled = {}
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            token_ids = self.token_ids[req_id]
            end = self.num_computed_tokens[req_id] + num_tokens
            assert end <= len(token_ids) and end <= len(self.block_ids[req_id]) * BLOCK_SIZE
            self.num_computed_tokens[req_id] = end
            if end == len(token_ids):
                token_ids.append(fake_next_token(token_ids))
                sampled[req_id] = [token_ids[-1]]
        return runner_output(out, sampled)


def run(scheduler: Scheduler, num_steps_in_flight: int) -> dict[str, tuple]:
    """Drive the scheduler like EngineCore with a batch queue; return each request's outputs."""
    runner, batch_queue = FakeRunner(), collections.deque()
    results = collections.defaultdict(list)
    while scheduler.has_unfinished_requests() or batch_queue:
        if scheduler.has_unfinished_requests():
            out = scheduler.schedule()
            batch_queue.append((out, runner.execute_model(out)))
            if len(batch_queue) < num_steps_in_flight and out.total_num_scheduled_tokens:
                continue
        for engine_output in scheduler.update_from_output(*batch_queue.popleft()).outputs:
            results[engine_output.request_id] += engine_output.new_token_ids
            if engine_output.finished:
                results[engine_output.request_id] = (
                    tuple(results[engine_output.request_id]),
                    engine_output.finish_reason,
                )
    return dict(results)


def expected_outputs(prompt: list[int], max_tokens: int) -> tuple:
    token_ids, output_ids = list(prompt), []
    while True:
        output_ids.append(fake_next_token(token_ids))
        token_ids.append(output_ids[-1])
        if output_ids[-1] == EOS:
            return tuple(output_ids), FinishReason.STOP
        if len(output_ids) == max_tokens:
            return tuple(output_ids), FinishReason.LENGTH


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("long_prefill_token_threshold", [0, 5])
def test_async_scheduling_gives_the_outputs_of_sync_scheduling(policy, long_prefill_token_threshold):
    shared = [1, 2, 3, 4, 6, 7, 8, 9]
    prompts = [shared[: 3 + i % 6] + [10 + i] * (i % 5) for i in range(16)]
    max_tokens = [3 + i % 7 for i in range(16)]
    expected = {f"r{i}": expected_outputs(p, m) for i, (p, m) in enumerate(zip(prompts, max_tokens))}
    assert sum(reason is FinishReason.STOP for _, reason in expected.values()) >= 3
    results, schedulers = [], []
    # The async scheduler with one step in flight behaves as the sync one (placeholders
    # always land before the next schedule), so it is safe under a synchronous engine loop.
    for async_scheduling, num_steps_in_flight in ((False, 1), (True, 1), (True, 2)):
        scheduler = make_scheduler(
            num_gpu_blocks=7,
            max_model_len=24,
            max_num_batched_tokens=12,
            max_num_seqs=4,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=policy,
            async_scheduling=async_scheduling,
        )
        for i, (prompt, num_tokens) in enumerate(zip(prompts, max_tokens)):
            request = make_request(f"r{i}", prompt, eos_token_id=EOS, max_tokens=num_tokens, priority=i % 3)
            scheduler.add_request(request)
        results.append(run(scheduler, num_steps_in_flight))
        schedulers.append(scheduler)
    assert results[0] == results[1] == results[2] == expected
    assert isinstance(schedulers[2], AsyncScheduler)
    for scheduler in schedulers:
        assert scheduler.num_preemptions > 0
        assert num_free_blocks(scheduler) == 6
        assert scheduler.kv_cache_manager.req_to_blocks == {}
    assert schedulers[1].num_steps == schedulers[0].num_steps
    assert schedulers[2].num_output_placeholders == {}
