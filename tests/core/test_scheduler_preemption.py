"""Recompute preemption: victim choice, resume order, kept outputs and leak-free busy runs."""

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
from vjx.core.request import RequestStatus
from vjx.core.sched.output import CachedRequestData
from vjx.core.sched.scheduler import Scheduler
from vjx.engine.messages import FinishReason

A_PROMPT = [10, 11, 12, 13, 14, 15, 16, 17]
B_PROMPT = [20, 21, 22, 23, 24, 25, 26, 27]


def waiting_ids(scheduler: Scheduler) -> list[str]:
    return [request.request_id for request in scheduler.waiting]


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

    # It resumes from its prefix-cache hit, keeping the output token it had.
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
    assert num_free_blocks(scheduler) == 4


def test_a_request_that_must_preempt_itself_stops_the_step():
    scheduler = make_scheduler(num_gpu_blocks=6, max_model_len=20, max_num_batched_tokens=20)
    scheduler.add_request(make_request("a", A_PROMPT))
    scheduler.add_request(make_request("b", B_PROMPT))
    step(scheduler, {"a": [30], "b": [40]})
    # a takes the one free block; b needs one too, and is itself the last admitted.
    out, _ = step(scheduler, {"a": [31]})
    assert out.scheduled_cached_reqs == CachedRequestData(["a"], [False], [([5],)], [8])
    assert scheduler.requests["b"].status is RequestStatus.PREEMPTED
    assert free_ids(scheduler) == [4, 3]


def test_preempted_requests_resume_in_admission_order_and_none_is_admitted_meanwhile():
    scheduler = make_scheduler(
        num_gpu_blocks=7, max_model_len=24, max_num_batched_tokens=16, long_prefill_token_threshold=8
    )
    scheduler.add_request(make_request("a", list(range(100, 124)), max_tokens=1))
    scheduler.add_request(make_request("b", [1, 2, 3]))
    scheduler.add_request(make_request("c", [4, 5, 6, 7, 8]))
    out, _ = step(scheduler, {"b": [50], "c": [60]})
    assert new_reqs(out) == [("a", ([1, 2],), 0), ("b", ([3],), 0), ("c", ([4, 5],), 0)]
    assert free_ids(scheduler) == [6]

    # a's next 8-token chunk needs two blocks: c goes. d would fit in the budget and in the
    # freed blocks, but a step that preempted admits nobody.
    scheduler.add_request(make_request("d", [9]))
    out, _ = step(scheduler, {"b": [51]})
    assert out.num_scheduled_tokens == {"a": 8, "b": 1}
    assert out.scheduled_cached_reqs == CachedRequestData(["a", "b"], [False, False], [([6, 5],), None], [8, 3])
    assert (waiting_ids(scheduler), free_ids(scheduler)) == (["c", "d"], [4])

    # Then b goes; it was admitted before c, so it resumes first.
    out, engine_outputs = step(scheduler, {"a": [70]})
    assert out.num_scheduled_tokens == {"a": 8}
    assert engine_outputs.outputs == [output("a", [70], FinishReason.LENGTH)]
    assert waiting_ids(scheduler) == ["b", "c", "d"]
    assert scheduler.num_preemptions == 2

    # An abort reaches a preempted request too; b and c lost their cached blocks to a.
    scheduler.finish_requests("c", RequestStatus.FINISHED_ABORTED)
    assert (waiting_ids(scheduler), free_ids(scheduler)) == (["b", "d"], [3, 4, 5, 6, 2, 1])
    out, engine_outputs = step(scheduler, {"b": [52], "d": [80]})
    assert out.finished_req_ids == {"a", "c"}
    assert new_reqs(out) == [("d", ([5],), 0)]
    assert out.scheduled_cached_reqs == CachedRequestData(["b"], [True], [([3, 4],)], [0])
    assert out.num_scheduled_tokens == {"b": 5, "d": 1}
    assert engine_outputs.outputs == [output("b", [52]), output("d", [80])]
    assert engine_outputs.finished_requests == {"c"}
    assert scheduler.requests["b"].output_token_ids == [50, 51, 52]
    assert free_ids(scheduler) == [6, 2, 1]


def test_priority_policy_preempts_the_lowest_priority_even_if_already_scheduled():
    scheduler = make_scheduler(num_gpu_blocks=6, max_model_len=20, max_num_batched_tokens=20, policy="priority")
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


def test_priority_victim_ties_go_to_the_latest_arrival():
    scheduler = make_scheduler(num_gpu_blocks=6, max_model_len=20, max_num_batched_tokens=20, policy="priority")
    scheduler.add_request(make_request("late", A_PROMPT, priority=1, arrival_time=2.0))
    scheduler.add_request(make_request("early", B_PROMPT, priority=1, arrival_time=1.0))
    out, _ = step(scheduler, {"late": [30], "early": [40]})
    assert list(out.num_scheduled_tokens) == ["early", "late"]
    out, _ = step(scheduler, {"early": [41]})
    assert out.num_scheduled_tokens == {"early": 1}
    assert waiting_ids(scheduler) == ["late"]


def simulate(scheduler: Scheduler, num_steps: int) -> int:
    """Run like a runner, check every diff against the scheduler's state; return the steps run."""
    runner_blocks: dict[str, list[int]] = {}
    runner_num_computed: dict[str, int] = {}
    budget = scheduler.max_num_scheduled_tokens
    for step_index in range(num_steps):
        if not scheduler.has_unfinished_requests():
            return step_index
        out = scheduler.schedule()
        assert out.total_num_scheduled_tokens <= budget
        assert len(scheduler.running) <= scheduler.max_num_running_reqs
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
@pytest.mark.parametrize("long_prefill_token_threshold", [0, 5])
def test_no_blocks_leak_after_a_busy_run_with_preemptions(policy, enable_prefix_caching, long_prefill_token_threshold):
    scheduler = make_scheduler(
        num_gpu_blocks=9,
        max_num_batched_tokens=12,
        max_num_seqs=3,
        enable_prefix_caching=enable_prefix_caching,
        long_prefill_token_threshold=long_prefill_token_threshold,
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
