"""Scheduler steps driven by hand-built ModelRunnerOutputs: exact diffs, blocks and outputs.

Preemption has its own file (test_scheduler_preemption.py), async scheduling too.
"""

import pytest

from tests.helpers.scheduler import (
    free_ids,
    make_request,
    make_scheduler,
    new_reqs,
    num_free_blocks,
    output,
    runner_output,
    step,
)
from vjx.core.request import Request, RequestStatus
from vjx.core.sched.output import CachedRequestData
from vjx.core.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from vjx.core.sched.scheduler import Scheduler
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest, FinishReason
from vjx.sampling_params import SamplingParams

B_PROMPT = [20, 21, 22, 23, 24, 25, 26, 27]


def test_continuous_batching_mixes_a_decode_with_a_new_prompt():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [100, 101, 102, 103, 104], max_tokens=2))
    out, engine_outputs = step(scheduler, {"a": [7]})
    assert new_reqs(out) == [("a", ([1, 2],), 0)]
    assert out.scheduled_new_reqs[0].prompt_token_ids == [100, 101, 102, 103, 104]
    assert out.scheduled_cached_reqs == CachedRequestData()
    assert (out.num_scheduled_tokens, out.total_num_scheduled_tokens) == ({"a": 5}, 5)
    assert engine_outputs == EngineCoreOutputs(outputs=[output("a", [7])], finished_requests=set())

    scheduler.add_request(make_request("b", B_PROMPT))
    out, engine_outputs = step(scheduler, {"a": [8], "b": [9]})
    assert new_reqs(out) == [("b", ([3, 4],), 0)]
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [None], [5])
    assert (out.num_scheduled_tokens, out.total_num_scheduled_tokens) == ({"a": 1, "b": 8}, 9)
    assert engine_outputs == EngineCoreOutputs(
        outputs=[output("a", [8], FinishReason.LENGTH), output("b", [9])], finished_requests={"a"}
    )
    assert free_ids(scheduler) == list(range(5, 17)) + [2, 1]

    out, _ = step(scheduler, {"b": [9]})
    assert out.finished_req_ids == {"a"}
    assert out.scheduled_cached_reqs == CachedRequestData(["b"], [False], [([5],)], [8])
    assert scheduler.get_request_counts() == (1, 0)


def test_token_budget_goes_to_running_requests_first_then_waiting_ones_in_order():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    scheduler.add_request(make_request("a", [1, 2, 3]))
    scheduler.add_request(make_request("b", [4, 5, 6]))
    step(scheduler, {"a": [7], "b": [8]})
    scheduler.add_request(make_request("c", list(range(30, 42))))
    scheduler.add_request(make_request("d", [9]))
    out, _ = step(scheduler, {"a": [7], "b": [8]})
    # Two decodes, then c's first 8 prompt tokens; d gets nothing from an empty budget.
    assert out.num_scheduled_tokens == {"a": 1, "b": 1, "c": 8}
    assert out.total_num_scheduled_tokens == 10
    assert [request.request_id for request in scheduler.waiting] == ["d"]
    out, _ = step(scheduler, {"a": [7], "b": [8], "c": [10], "d": [11]})
    assert out.num_scheduled_tokens == {"a": 1, "b": 1, "c": 4, "d": 1}


def test_chunked_prefill_over_several_steps():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", list(range(100, 110))))
    out, engine_outputs = step(scheduler, {})
    assert new_reqs(out) == [("a", ([1],), 0)]
    assert out.num_scheduled_tokens == {"a": 4}
    assert engine_outputs.outputs == []

    scheduler.add_request(make_request("b", [200, 201, 202]))
    out, engine_outputs = step(scheduler, {})
    assert out.scheduled_new_reqs == []
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [([2],)], [4])
    assert engine_outputs.outputs == []

    out, engine_outputs = step(scheduler, {"a": [5]})
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [([3],)], [8])
    assert new_reqs(out) == [("b", ([4],), 0)]
    assert out.num_scheduled_tokens == {"a": 2, "b": 2}
    assert engine_outputs.outputs == [output("a", [5])]

    out, engine_outputs = step(scheduler, {"a": [6], "b": [7]})
    assert out.scheduled_cached_reqs == CachedRequestData(["a", "b"], [False, False], [None, None], [10, 2])
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert engine_outputs.outputs == [output("a", [6]), output("b", [7])]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_it_fits_in():
    scheduler = make_scheduler(enable_chunked_prefill=False)
    scheduler.add_request(make_request("a", list(range(100, 120))))
    scheduler.add_request(make_request("b", list(range(200, 216))))
    scheduler.add_request(make_request("c", [300, 301]))
    out, _ = step(scheduler, {"a": [1]})
    # b needs 16 tokens and 12 are left; c fits but waits behind b (first come first served).
    assert out.num_scheduled_tokens == {"a": 20}
    out, _ = step(scheduler, {"a": [2], "b": [3], "c": [4]})
    assert out.num_scheduled_tokens == {"a": 1, "b": 16, "c": 2}


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [
        # A 20-token prompt admitted first takes the whole budget: d waits two steps.
        (0, [{"long": 8}, {"long": 8}, {"long": 4, "d": 3}, {"long": 1, "d": 1}]),
        # Capped at 4 tokens a step, it leaves room for d from the first step on.
        (4, [{"long": 4, "d": 3}, {"long": 4, "d": 1}, {"long": 4, "d": 1}, {"long": 4, "d": 1}]),
    ],
    ids=["no_cap", "cap_4"],
)
def test_long_prefill_token_threshold_keeps_short_requests_running(threshold, expected):
    scheduler = make_scheduler(max_num_batched_tokens=8, long_prefill_token_threshold=threshold)
    scheduler.add_request(make_request("long", list(range(100, 120))))
    scheduler.add_request(make_request("d", [1, 2, 3]))
    scheduled = []
    for _ in expected:
        request = scheduler.requests["long"]
        sampled = {"d": [9]}
        out = scheduler.schedule()
        if request.num_computed_tokens == request.num_tokens:
            sampled["long"] = [9]
        scheduler.update_from_output(out, runner_output(out, sampled))
        scheduled.append(out.num_scheduled_tokens)
    assert scheduled == expected


def test_max_num_seqs_caps_the_running_requests():
    scheduler = make_scheduler(max_num_seqs=2)
    for request_id in "abc":
        max_tokens = 1 if request_id == "a" else 4
        scheduler.add_request(make_request(request_id, [1, 2, 3], max_tokens=max_tokens))
    out, engine_outputs = step(scheduler, {"a": [5], "b": [6]})
    assert out.num_scheduled_tokens == {"a": 3, "b": 3}
    assert engine_outputs.finished_requests == {"a"}
    assert scheduler.get_request_counts() == (1, 1)
    out, _ = step(scheduler, {"b": [6], "c": [7]})
    assert out.num_scheduled_tokens == {"b": 1, "c": 3}


def test_priority_policy_admits_by_priority_then_arrival():
    scheduler = make_scheduler(policy="priority", max_num_seqs=3)
    arrivals = (("low", 2, 0.0), ("high", 0, 1.0), ("mid", 1, 3.0), ("early", 1, 2.0))
    for request_id, priority, arrival_time in arrivals:
        request = make_request(request_id, [1, 2], priority=priority, arrival_time=arrival_time)
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["high", "early", "mid"]
    assert [r.request_id for r in scheduler.waiting] == ["low"]


def test_prefix_cache_hit_through_the_scheduler():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", list(range(1, 11)), max_tokens=1))
    step(scheduler, {"a": [60]})
    assert free_ids(scheduler) == list(range(4, 17)) + [3, 2, 1]
    scheduler.add_request(make_request("b", list(range(1, 9)) + [50, 51]))
    out, engine_outputs = step(scheduler, {"b": [61]})
    assert new_reqs(out) == [("b", ([1, 2, 4],), 8)]
    assert out.num_scheduled_tokens == {"b": 2}
    assert engine_outputs.outputs == [output("b", [61], num_cached_tokens=8)]
    # A prompt of exactly two blocks recomputes its last block to get its logits.
    scheduler.add_request(make_request("c", list(range(1, 9))))
    out, _ = step(scheduler, {"b": [62], "c": [63]})
    assert new_reqs(out) == [("c", ([1, 5],), 4)]
    assert out.num_scheduled_tokens == {"b": 1, "c": 4}
    running = scheduler.running
    assert scheduler.kv_cache_manager.get_num_common_prefix_blocks(running[0].request_id, len(running)) == (1,)
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.num_requests, stats.num_queried_tokens, stats.num_hit_tokens) == (3, 28, 12)


def run_one_request(scheduler: Scheduler, request: Request, sampled: list[list[int]]):
    scheduler.add_request(request)
    outputs = []
    for token_ids in sampled:
        outputs += step(scheduler, {request.request_id: token_ids})[1].outputs
    return outputs


@pytest.mark.parametrize(
    ("request_kwargs", "sampled", "expected"),
    [
        ({"eos_token_id": 2}, [[5], [2]], [([5], None, None), ([2], FinishReason.STOP, None)]),
        (
            {"eos_token_id": 2, "ignore_eos": True, "max_tokens": 3},
            [[2], [2], [2]],
            [([2], None, None), ([2], None, None), ([2], FinishReason.LENGTH, None)],
        ),
        ({"stop_token_ids": [9]}, [[5], [9]], [([5], None, None), ([9], FinishReason.STOP, 9)]),
        ({"max_tokens": 2}, [[5], [6]], [([5], None, None), ([6], FinishReason.LENGTH, None)]),
        (
            {"eos_token_id": 2, "stop_token_ids": [9], "min_tokens": 3},
            [[2], [9], [2]],
            [([2], None, None), ([9], None, None), ([2], FinishReason.STOP, None)],
        ),
        (
            {"eos_token_id": 2, "max_tokens": 2},
            [[5], [2]],
            [([5], None, None), ([2], FinishReason.STOP, None)],
        ),
        ({"eos_token_id": 2}, [[5, 2, 7]], [([5, 2], FinishReason.STOP, None)]),
    ],
    ids=["eos", "ignore_eos", "stop_token", "max_tokens", "min_tokens", "eos_last", "drop_after"],
)
def test_stop_conditions(request_kwargs, sampled, expected):
    scheduler = make_scheduler()
    request = make_request("r", [1, 2, 3], **request_kwargs)
    outputs = run_one_request(scheduler, request, sampled)
    assert [(o.new_token_ids, o.finish_reason, o.stop_reason) for o in outputs] == expected
    assert request.output_token_ids == [t for o in outputs for t in o.new_token_ids]
    assert not scheduler.has_unfinished_requests()
    assert num_free_blocks(scheduler) == 16


def test_max_model_len_stops_a_request():
    scheduler = make_scheduler(max_model_len=16)
    request = make_request("r", list(range(14)), max_tokens=None)
    outputs = run_one_request(scheduler, request, [[5], [6]])
    assert outputs == [output("r", [5]), output("r", [6], FinishReason.LENGTH)]
    assert request.num_tokens == 16


def test_a_prompt_of_max_model_len_in_chunks_samples_one_token():
    scheduler = make_scheduler(max_model_len=16, max_num_batched_tokens=8)
    request = make_request("r", list(range(16)))
    outputs = run_one_request(scheduler, request, [[], [5]])
    assert outputs == [output("r", [5], FinishReason.LENGTH)]
    assert not scheduler.has_unfinished_requests()


def test_abort_frees_blocks_at_once_in_every_state():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=8)
    scheduler.add_request(make_request("decoding", [1, 2, 3, 4, 5, 6]))
    scheduler.add_request(make_request("prefilling", list(range(10, 22))))
    scheduler.add_request(make_request("waiting", [7, 8]))
    out, _ = step(scheduler, {"decoding": [9]})
    assert out.num_scheduled_tokens == {"decoding": 6, "prefilling": 2}
    assert scheduler.kv_cache_manager.get_block_ids("prefilling") == ([3],)
    assert num_free_blocks(scheduler) == 13

    scheduler.finish_requests("prefilling", RequestStatus.FINISHED_ABORTED)
    assert num_free_blocks(scheduler) == 14
    assert [r.request_id for r in scheduler.running] == ["decoding"]
    scheduler.finish_requests(["waiting", "decoding", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert num_free_blocks(scheduler) == 16
    assert free_ids(scheduler) == list(range(4, 17)) + [3, 2, 1]
    assert scheduler.get_num_unfinished_requests() == 0
    assert scheduler.has_finished_requests()
    assert scheduler.requests == {}
    out, engine_outputs = step(scheduler, {})
    assert out.finished_req_ids == {"decoding", "prefilling", "waiting"}
    assert out.total_num_scheduled_tokens == 0
    assert engine_outputs == EngineCoreOutputs(outputs=[], finished_requests={"decoding", "prefilling", "waiting"})
    assert not scheduler.has_finished_requests()


def test_abort_between_schedule_and_update_drops_the_tokens():
    scheduler = make_scheduler()
    request = make_request("a", [1, 2, 3])
    scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    engine_outputs = scheduler.update_from_output(out, runner_output(out, {"a": [5]}))
    assert engine_outputs == EngineCoreOutputs(outputs=[], finished_requests={"a"})
    assert request.get_finished_reason() is FinishReason.ABORT
    assert request.output_token_ids == []
    with pytest.raises(ValueError, match="finished_status must be a finished status, got RUNNING"):
        scheduler.finish_requests("a", RequestStatus.RUNNING)


def test_add_request_and_config_validation():
    scheduler = make_scheduler(max_model_len=16)
    scheduler.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="request_id 'a' is already in the scheduler"):
        scheduler.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="has 17 tokens; it must have 1 to max_model_len=16"):
        scheduler.add_request(make_request("b", list(range(17))))
    with pytest.raises(ValueError, match="has 0 tokens"):
        scheduler.add_request(make_request("c", []))
    with pytest.raises(ValueError, match="num_gpu_blocks=4 holds 12 tokens .* max_model_len=16"):
        make_scheduler(num_gpu_blocks=4, max_model_len=16)
    with pytest.raises(ValueError, match=r"scheduling_policy must be one of \['fcfs', 'prio"):
        make_scheduler(policy="lifo")
    with pytest.raises(ValueError, match="max_num_batched_tokens=16 must be at least max_mo"):
        make_scheduler(enable_chunked_prefill=False, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="got 8 with enable_chunked_prefill=False"):
        make_scheduler(enable_chunked_prefill=False, long_prefill_token_threshold=8)
    with pytest.raises(ValueError, match="long_prefill_token_threshold must be 0 .* got -1"):
        make_scheduler(long_prefill_token_threshold=-1)


def test_make_stats_reports_gauges_and_counts_since_the_last_call():
    scheduler = make_scheduler(max_num_seqs=2)
    assert scheduler.make_stats() == SchedulerStats(0, 0, 0.0)
    scheduler.add_request(make_request("a", list(range(1, 11))))
    scheduler.add_request(make_request("b", list(range(1, 9)) + [50, 51]))
    scheduler.add_request(make_request("c", [1]))
    step(scheduler, {"a": [60], "b": [61]})
    step(scheduler, {"a": [62], "b": [63]})
    stats = scheduler.make_stats()
    # b hits a's two full blocks (cached when a was admitted, earlier in the same step) and
    # holds one block of its own; c is never looked up, as running is full (max_num_seqs=2).
    assert stats == SchedulerStats(
        num_running_reqs=2,
        num_waiting_reqs=1,
        kv_cache_usage=4 / 16,
        num_steps=2,
        num_scheduled_tokens=14,
        num_preemptions=0,
        num_prefix_queried_tokens=20,
        num_prefix_hit_tokens=8,
    )
    assert (stats.num_tokens_per_step, stats.prefix_cache_hit_rate) == (7.0, 0.4)
    assert str(stats) == (
        "Running: 2 reqs, Waiting: 1 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 40.0%, "
        "Preemptions: 0, Tokens per step: 7.0 over 2 steps"
    )
    assert scheduler.make_stats() == SchedulerStats(2, 1, 4 / 16)
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    step(scheduler, {"c": [64]})
    stats = scheduler.make_stats()
    assert (stats.num_running_reqs, stats.num_steps, stats.num_scheduled_tokens) == (1, 1, 1)
    assert (stats.num_prefix_queried_tokens, stats.num_prefix_hit_tokens) == (1, 0)


def test_request_and_status():
    core_request = EngineCoreRequest("x", [1, 2], SamplingParams(max_tokens=3), 2, 5.0, priority=1)
    request = Request.from_engine_core_request(core_request)
    assert (request.request_id, request.prompt_token_ids, request.eos_token_id) == ("x", [1, 2], 2)
    assert (request.arrival_time, request.priority, request.max_tokens) == (5.0, 1, 3)
    assert request.status is RequestStatus.WAITING
    assert (request.num_cached_tokens, request.block_hashes) == (-1, [])
    request.append_output_token_ids(7)
    request.append_output_token_ids([8, 9])
    assert (request.output_token_ids, request.all_token_ids) == ([7, 8, 9], [1, 2, 7, 8, 9])
    assert (request.num_tokens, request.num_prompt_tokens, request.num_output_tokens) == (5, 2, 3)
    assert request.prompt_token_ids == [1, 2]
    assert not request.is_finished() and request.get_finished_reason() is None
    statuses = [
        (RequestStatus.FINISHED_STOPPED, FinishReason.STOP),
        (RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH),
        (RequestStatus.FINISHED_ABORTED, FinishReason.ABORT),
    ]
    for status, reason in statuses:
        assert RequestStatus.is_finished(status)
        assert RequestStatus.get_finished_reason(status) is reason
    alive = (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED)
    assert not any(RequestStatus.is_finished(status) for status in alive)


def test_request_queues():
    a = make_request("a", [1], priority=1, arrival_time=0.0)
    b = make_request("b", [1], priority=0, arrival_time=1.0)
    c = make_request("c", [1], priority=1, arrival_time=2.0)
    fcfs = create_request_queue("fcfs")
    assert isinstance(fcfs, FCFSRequestQueue)
    for request in (a, b, c):
        fcfs.add_request(request)
    fcfs.prepend_request(c)
    assert [r.request_id for r in fcfs] == ["c", "a", "b", "c"]
    fcfs.remove_requests([b])
    assert [r.request_id for r in fcfs] == ["c", "a", "c"]
    assert fcfs.pop_request() is c and fcfs.peek_request() is a and len(fcfs) == 2

    priority = create_request_queue(SchedulingPolicy.PRIORITY)
    assert isinstance(priority, PriorityRequestQueue)
    for request in (c, a, b):
        priority.add_request(request)
    assert [r.request_id for r in priority] == ["b", "a", "c"]
    priority.remove_requests([a])
    assert priority.pop_request() is b and priority.peek_request() is c and len(priority) == 1
    priority.pop_request()
    assert not priority
    with pytest.raises(IndexError, match="peek_request: the queue is empty"):
        priority.peek_request()
