"""Scheduler steps driven by hand-built ModelRunnerOutputs: exact diffs, blocks and outputs."""

import pytest

from vjx.config import CacheConfig, SchedulerConfig
from vjx.core.request import Request, RequestStatus
from vjx.core.sched.output import CachedRequestData, SchedulerOutput
from vjx.core.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from vjx.core.sched.scheduler import Scheduler
from vjx.engine.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from vjx.outputs import ModelRunnerOutput
from vjx.sampling_params import SamplingParams


def make_scheduler(
    *,
    num_gpu_blocks: int = 17,
    max_model_len: int = 32,
    max_num_batched_tokens: int = 32,
    max_num_seqs: int = 4,
    enable_chunked_prefill: bool = True,
    enable_prefix_caching: bool = True,
    policy: str = "fcfs",
) -> Scheduler:
    """Blocks of 4 tokens; block 0 is reserved, so 17 blocks give 16 usable ones."""
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
    )
    cache_config = CacheConfig(
        block_size=4,
        gpu_memory_utilization=0.9,
        num_gpu_blocks_override=None,
        enable_prefix_caching=enable_prefix_caching,
    )
    return Scheduler(scheduler_config, cache_config, num_gpu_blocks, policy=policy)


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    eos_token_id: int | None = None,
    arrival_time: float = 0.0,
    priority: int = 0,
    **sampling_kwargs,
) -> Request:
    sampling_params = SamplingParams(**sampling_kwargs)
    return Request(
        request_id, prompt_token_ids, sampling_params, eos_token_id, arrival_time, priority
    )


def runner_output(out: SchedulerOutput, sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    """What the runner returns: a row per scheduled request, tokens only where given."""
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=[sampled.get(req_id, []) for req_id in req_ids],
    )


def step(scheduler: Scheduler, sampled: dict[str, list[int]]):
    """One schedule -> (runner) -> update round; returns both halves."""
    out = scheduler.schedule()
    return out, scheduler.update_from_output(out, runner_output(out, sampled))


def new_reqs(scheduler_output: SchedulerOutput) -> list[tuple]:
    return [
        (r.req_id, r.block_ids, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs
    ]


def free_ids(scheduler: Scheduler) -> list[int]:
    queue = scheduler.kv_cache_manager.block_pool.free_block_queue
    return [block.block_id for block in queue.get_all_free_blocks()]


def output(request_id, new_token_ids, finish_reason=None, stop_reason=None, num_cached_tokens=0):
    return EngineCoreOutput(
        request_id, new_token_ids, finish_reason, stop_reason, num_cached_tokens
    )


A_PROMPT = [10, 11, 12, 13, 14, 15, 16, 17]
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
    assert out.scheduled_cached_reqs == CachedRequestData(
        ["a", "b"], [False, False], [None, None], [10, 2]
    )
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
    with pytest.raises(ValueError, match="max_num_batched_tokens=16 must be at least max_mo"):
        make_scheduler(enable_chunked_prefill=False, max_num_batched_tokens=16)


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


def test_preemption_frees_the_last_request_and_resumes_it_with_all_its_blocks():
    scheduler = make_scheduler(num_gpu_blocks=5, max_model_len=16, max_num_batched_tokens=16)
    scheduler.add_request(make_request("a", A_PROMPT, max_tokens=4))
    scheduler.add_request(make_request("b", B_PROMPT, max_tokens=4))
    out, _ = step(scheduler, {"a": [30], "b": [40]})
    assert new_reqs(out) == [("a", ([1, 2],), 0), ("b", ([3, 4],), 0)]

    # a needs a third block and none is free: b, the last admitted, is preempted.
    out, _ = step(scheduler, {"a": [31]})
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [([4],)], [8])
    b = scheduler.requests["b"]
    assert (b.status, b.num_computed_tokens, b.num_preemptions) == (RequestStatus.PREEMPTED, 0, 1)
    assert free_ids(scheduler) == [3]
    assert list(scheduler.waiting) == [b]

    # b's first block is still cached, but it needs three blocks and one is free.
    out, _ = step(scheduler, {"a": [32]})
    assert out.num_scheduled_tokens == {"a": 1}
    out, engine_outputs = step(scheduler, {"a": [33]})
    assert engine_outputs.finished_requests == {"a"}
    assert free_ids(scheduler) == [3, 4, 2, 1]

    out, engine_outputs = step(scheduler, {"b": [41]})
    assert out.finished_req_ids == {"a"}
    assert out.scheduled_new_reqs == []
    assert out.scheduled_cached_reqs == CachedRequestData(["b"], [True], [([3, 4, 2],)], [4])
    assert out.num_scheduled_tokens == {"b": 5}
    assert engine_outputs.outputs == [output("b", [41])]
    assert b.output_token_ids == [40, 41]
    step(scheduler, {"b": [42]})
    _, engine_outputs = step(scheduler, {"b": [43]})
    assert engine_outputs.outputs == [output("b", [43], FinishReason.LENGTH)]
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 4


def test_a_request_that_must_preempt_itself_stops_the_step():
    scheduler = make_scheduler(num_gpu_blocks=6, max_model_len=20, max_num_batched_tokens=20)
    scheduler.add_request(make_request("a", A_PROMPT))
    scheduler.add_request(make_request("b", B_PROMPT))
    step(scheduler, {"a": [30], "b": [40]})
    out, _ = step(scheduler, {"a": [31]})
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [([5],)], [8])
    assert scheduler.requests["b"].status is RequestStatus.PREEMPTED
    assert free_ids(scheduler) == [4, 3]


def test_priority_policy_preempts_the_lowest_priority_even_if_already_scheduled():
    scheduler = make_scheduler(
        num_gpu_blocks=6, max_model_len=20, max_num_batched_tokens=20, policy="priority"
    )
    scheduler.add_request(make_request("a", A_PROMPT, priority=1, arrival_time=0.0))
    step(scheduler, {"a": [30]})
    scheduler.add_request(make_request("b", B_PROMPT, priority=0, arrival_time=1.0, max_tokens=3))
    out, _ = step(scheduler, {"a": [31], "b": [40]})
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [([3],)], [8])
    assert new_reqs(out) == [("b", ([4, 5],), 0)]

    # a fits in its blocks and is scheduled first, but b needs a block: a (priority 1) goes.
    out, _ = step(scheduler, {"b": [41]})
    assert out.num_scheduled_tokens == {"b": 1}
    assert out.total_num_scheduled_tokens == 1
    assert out.scheduled_cached_reqs == CachedRequestData(["b"], [False], [([3],)], [8])
    assert scheduler.requests["a"].status is RequestStatus.PREEMPTED
    assert free_ids(scheduler) == [2, 1]

    out, engine_outputs = step(scheduler, {"b": [42]})
    assert out.num_scheduled_tokens == {"b": 1}
    assert engine_outputs.finished_requests == {"b"}
    out, _ = step(scheduler, {"a": [32]})
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [True], [([1, 2, 3],)], [8])
    assert out.num_scheduled_tokens == {"a": 2}
    assert free_ids(scheduler) == [5, 4]


def test_priority_policy_admits_by_priority_then_arrival():
    scheduler = make_scheduler(policy="priority")
    arrivals = (("low", 2, 0.0), ("high", 0, 1.0), ("mid", 1, 3.0), ("early", 1, 2.0))
    for request_id, priority, arrival_time in arrivals:
        request = make_request(request_id, [1, 2], priority=priority, arrival_time=arrival_time)
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["high", "early", "mid", "low"]


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
    assert out.num_common_prefix_blocks == (1,)
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
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 16


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


def test_abort_frees_blocks_at_once():
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add_request(make_request("a", [1, 2, 3, 4, 5, 6]))
    scheduler.add_request(make_request("b", [7, 8]))
    out, _ = step(scheduler, {"a": [9]})
    assert new_reqs(out) == [("a", ([1, 2],), 0)]
    scheduler.finish_requests(["a", "b", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 16
    assert free_ids(scheduler) == list(range(3, 17)) + [2, 1]
    assert scheduler.get_num_unfinished_requests() == 0
    assert scheduler.has_finished_requests()
    assert scheduler.requests == {}
    out, engine_outputs = step(scheduler, {})
    assert out.finished_req_ids == {"a", "b"}
    assert out.total_num_scheduled_tokens == 0
    assert engine_outputs == EngineCoreOutputs(outputs=[], finished_requests={"a", "b"})
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
    with pytest.raises(ValueError, match=r"one of \['fcfs', 'priority'\], got 'lifo'"):
        make_scheduler(policy="lifo")


def simulate(scheduler: Scheduler, num_steps: int) -> int:
    """Run like a runner, check every diff against the scheduler's state; return the steps run."""
    runner_blocks: dict[str, list[int]] = {}
    runner_num_computed: dict[str, int] = {}
    for step_index in range(num_steps):
        if not scheduler.has_unfinished_requests():
            return step_index
        out = scheduler.schedule()
        assert out.total_num_scheduled_tokens <= 12
        assert len(scheduler.running) <= 3
        for req_id in out.finished_req_ids:
            runner_blocks.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            runner_blocks[new.req_id] = list(new.block_ids[0])
            runner_num_computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        rows = zip(
            cached.req_ids,
            cached.resumed_from_preemption,
            cached.new_block_ids,
            cached.num_computed_tokens,
        )
        for req_id, resumed, new_block_ids, num_computed in rows:
            if resumed:
                runner_blocks[req_id] = []
            else:
                assert runner_num_computed[req_id] == num_computed
            runner_blocks[req_id] += new_block_ids[0] if new_block_ids else []
            runner_num_computed[req_id] = num_computed
        sampled = {}
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            assert (runner_blocks[req_id],) == scheduler.kv_cache_manager.get_block_ids(req_id)
            runner_num_computed[req_id] += num_tokens
            request = scheduler.requests[req_id]
            if request.num_computed_tokens == request.num_tokens:
                sampled[req_id] = [1000 + step_index]
        scheduler.update_from_output(out, runner_output(out, sampled))
    return num_steps


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_no_blocks_leak_after_a_busy_run_with_preemptions(policy, enable_prefix_caching):
    scheduler = make_scheduler(
        num_gpu_blocks=9,
        max_num_batched_tokens=12,
        max_num_seqs=3,
        enable_prefix_caching=enable_prefix_caching,
        policy=policy,
    )
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    prompts = [shared[: 4 + i % 5] + [100 + i] * (i % 7) for i in range(12)]
    requests = [
        make_request(f"r{i}", prompt, max_tokens=4 + i % 6, ignore_eos=True, priority=i % 3)
        for i, prompt in enumerate(prompts)
    ]
    for request in requests:
        scheduler.add_request(request)
    assert simulate(scheduler, num_steps=300) < 300
    assert sum(request.num_preemptions for request in requests) == scheduler.num_preemptions > 0
    assert [request.num_output_tokens for request in requests] == [4 + i % 6 for i in range(12)]
    assert all(request.status is RequestStatus.FINISHED_LENGTH_CAPPED for request in requests)
    manager = scheduler.kv_cache_manager
    assert manager.block_pool.get_num_free_blocks() == 8
    assert all(block.ref_cnt == 0 for block in manager.block_pool.blocks)
    assert (manager.req_to_blocks, manager.num_cached_block, scheduler.running) == ({}, {}, [])
    assert scheduler.reset_prefix_cache() is True


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
