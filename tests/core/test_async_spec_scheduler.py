"""AsyncScheduler with speculative decoding: drafts are placeholders (-1) counted as accepted
while their step is in flight, and the rejected ones are taken back when it lands.

Hand-built runner outputs drive two steps in flight (step N+1 is scheduled before the update
from step N, as EngineCore's batch queue does) and check every count; a fake runner that
keeps the true tokens and positions as the device would then checks that the outputs are
those of plain greedy decoding through rejections, preemptions, stops and a small pool.
"""

import collections
import concurrent.futures
import dataclasses

import pytest

from tests.helpers.scheduler import BLOCK_SIZE, make_request, make_scheduler, num_free_blocks, output, runner_output
from vjx.core.request import RequestStatus
from vjx.core.sched.async_scheduler import AsyncScheduler
from vjx.core.sched.output import SchedulerOutput
from vjx.core.sched.stats import SpecDecodingStats
from vjx.engine.messages import EngineCoreOutputs, FinishReason
from vjx.outputs import ModelRunnerOutput
from vjx.sampling_params import StructuredOutputsParams
from vjx.structured_output.request import StructuredOutputRequest

K = 2
"""Drafts per step."""
PROMPT = [1, 2, 3, 4, 5]


def make_spec_scheduler(metrics: str = "none", **kwargs) -> AsyncScheduler:
    base = make_scheduler(async_scheduling=True, **kwargs)
    config = dataclasses.replace(
        base.scheduler_config, num_spec_tokens=K, num_lookahead_tokens=K, per_request_spec_decode_metrics=metrics
    )
    return AsyncScheduler(config, base.cache_config, base.kv_cache_config)


def update(scheduler, out, sampled):
    return scheduler.update_from_output(out, runner_output(out, sampled))


def cached(out: SchedulerOutput) -> list[tuple]:
    """Per running request: (id, new block ids, num_computed_tokens: its first position)."""
    data = out.scheduled_cached_reqs
    return list(zip(data.req_ids, data.new_block_ids, data.num_computed_tokens))


def started(scheduler, **params):
    """A request of PROMPT after its prefill (step 1) and first decode (step 2) are scheduled."""
    request = make_request("a", PROMPT, **params)
    scheduler.add_request(request)
    out1 = scheduler.schedule()
    assert out1.num_scheduled_tokens == {"a": 5} and out1.scheduled_spec_decode_tokens == {}
    assert scheduler.num_output_placeholders == {"a": 1}
    out2 = scheduler.schedule()
    # The token step 1 samples, at position 5, and two drafts after it, all in flight.
    assert out2.num_scheduled_tokens == {"a": 3}
    assert out2.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert cached(out2) == [("a", ([3],), 5)]
    assert (request.num_computed_tokens, request.num_tokens) == (8, 5)
    assert scheduler.num_output_placeholders == {"a": 4}
    return request, out1, out2


def test_drafts_in_flight_count_as_accepted_until_their_step_is_back():
    scheduler = make_spec_scheduler()
    request, out1, out2 = started(scheduler, max_tokens=20)
    assert request.spec_token_ids == [-1, -1]
    assert update(scheduler, out1, {"a": [10]}).outputs == [output("a", [10])]
    assert scheduler.num_output_placeholders == {"a": 3}
    out3 = scheduler.schedule()
    assert cached(out3) == [("a", ([4],), 8)]
    assert out3.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert update(scheduler, out2, {"a": [11, 12, 13]}).outputs == [output("a", [11, 12, 13])]
    assert (request.num_computed_tokens, scheduler.num_output_placeholders) == (11, {"a": 3})
    out4 = scheduler.schedule()
    # Blocks cover position 16 + 2 lookahead slots already: none new. Of the 14 tokens
    # computed once step 4 runs, only the 9 known ones may fill cached blocks.
    assert cached(out4) == [("a", None, 11)]
    assert (request.num_tokens, scheduler.kv_cache_manager.num_cached_block) == (9, {"a": 2})
    update(scheduler, out3, {"a": [14, 15, 16]})
    assert request.output_token_ids == [10, 11, 12, 13, 14, 15, 16]
    assert (request.num_computed_tokens, scheduler.num_output_placeholders) == (14, {"a": 3})
    assert scheduler.spec_decoding_stats == SpecDecodingStats(2, 4, 4, (2, 2))
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert (num_free_blocks(scheduler), scheduler.num_output_placeholders) == (16, {})


@pytest.mark.parametrize(
    "sampled, num_computed_tokens, per_pos",
    [([11, 12, 13], 11, (1, 1)), ([11, 20], 10, (1, 0)), ([20], 9, (0, 0))],
    ids=["all-accepted", "one-rejected", "none-accepted"],
)
def test_rejected_drafts_are_taken_back_from_the_computed_tokens_and_the_placeholders(
    sampled, num_computed_tokens, per_pos
):
    scheduler = make_spec_scheduler()
    request, out1, out2 = started(scheduler, max_tokens=20)
    update(scheduler, out1, {"a": [10]})
    out3 = scheduler.schedule()
    assert (cached(out3), request.num_computed_tokens) == ([("a", ([4],), 8)], 11)
    assert update(scheduler, out2, {"a": sampled}).outputs == [output("a", sampled)]
    # Step 3 (in flight) is the rejected drafts' rows again: the runner placed its tokens.
    assert (request.num_computed_tokens, scheduler.num_output_placeholders) == (num_computed_tokens, {"a": 3})
    out4 = scheduler.schedule()
    assert out4.num_scheduled_tokens == {"a": 3} and out4.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert cached(out4)[0][2] == num_computed_tokens
    update(scheduler, out3, {"a": [30]})
    assert request.output_token_ids == [10, *sampled, 30]
    # Step 3 verified two drafts and rejected both: step 4 (in flight) starts one further.
    assert (request.num_computed_tokens, scheduler.num_output_placeholders) == (num_computed_tokens + 1, {"a": 3})
    assert scheduler.spec_decoding_stats == SpecDecodingStats(2, 4, len(sampled) - 1, per_pos)


def test_the_token_budget_cuts_drafts_as_in_sync_mode():
    scheduler = make_spec_scheduler(max_num_batched_tokens=4)
    for req_id in ("a", "b"):
        scheduler.add_request(make_request(req_id, [1, 2]))
    out1 = scheduler.schedule()
    out2 = scheduler.schedule()
    # a takes its token and two drafts; b gets its token only, and no draft.
    assert out2.num_scheduled_tokens == {"a": 3, "b": 1}
    assert out2.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert scheduler.num_output_placeholders == {"a": 4, "b": 2}
    update(scheduler, out1, {"a": [10], "b": [20]})
    out3 = scheduler.schedule()
    assert out3.num_scheduled_tokens == {"a": 3, "b": 1}
    update(scheduler, out2, {"a": [11, 12, 13], "b": [21]})
    assert scheduler.spec_decoding_stats == SpecDecodingStats(1, 2, 2, (1, 1))
    assert [r.num_computed_tokens for r in scheduler.running] == [8, 4]


def test_max_tokens_in_flight_schedules_no_step_and_a_stop_inside_the_drafts_frees_at_once():
    scheduler = make_spec_scheduler()
    request, out1, out2 = started(scheduler, max_tokens=4)
    # Counting step 2's drafts as accepted, it brings the 4th output: no drafts are left.
    assert request.spec_token_ids == []
    update(scheduler, out1, {"a": [10]})
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    engine_outputs = update(scheduler, out2, {"a": [11, 12, 13]})
    assert engine_outputs == EngineCoreOutputs([output("a", [11, 12, 13], FinishReason.LENGTH)], {"a"})
    assert (num_free_blocks(scheduler), scheduler.num_output_placeholders) == (16, {})


def test_max_tokens_in_flight_waits_for_the_rejections_then_goes_on_without_drafts():
    scheduler = make_spec_scheduler()
    request, out1, out2 = started(scheduler, max_tokens=4)
    update(scheduler, out1, {"a": [10]})
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    update(scheduler, out2, {"a": [20]})
    assert (request.num_computed_tokens, scheduler.num_output_placeholders) == (6, {"a": 0})
    out4 = scheduler.schedule()
    assert (cached(out4), out4.scheduled_spec_decode_tokens) == ([("a", None, 6)], {})
    # Two outputs back and one in flight: the next step brings the 4th, with no draft.
    assert request.spec_token_ids == []
    out5 = scheduler.schedule()
    assert cached(out5) == [("a", None, 7)]
    update(scheduler, out4, {"a": [21]})
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    assert update(scheduler, out5, {"a": [22]}).outputs == [output("a", [22], FinishReason.LENGTH)]
    assert request.output_token_ids == [10, 20, 21, 22]


def test_eos_inside_accepted_drafts_stops_the_request_with_its_next_step_in_flight():
    scheduler = make_spec_scheduler()
    request, out1, out2 = started(scheduler, max_tokens=20, eos_token_id=2)
    update(scheduler, out1, {"a": [10]})
    out3 = scheduler.schedule()
    engine_outputs = update(scheduler, out2, {"a": [11, 2, 13]})
    assert engine_outputs == EngineCoreOutputs([output("a", [11, 2], FinishReason.STOP)], {"a"})
    assert scheduler.spec_decoding_stats == SpecDecodingStats(1, 2, 2, (1, 1))
    assert (num_free_blocks(scheduler), scheduler.num_output_placeholders) == (16, {})
    assert update(scheduler, out3, {"a": [14, 15, 16]}) == EngineCoreOutputs([], set())
    assert scheduler.schedule().finished_req_ids == {"a"}


def test_drafts_stop_at_max_model_len_and_slots_never_pass_it():
    scheduler = make_spec_scheduler(max_model_len=12)
    request, out1, out2 = started(scheduler, max_tokens=None)
    update(scheduler, out1, {"a": [10]})
    # Positions 8 to 10: the step samples at 11, the last position; lookahead slots stop there.
    out3 = scheduler.schedule()
    assert (cached(out3), out3.scheduled_spec_decode_tokens) == ([("a", None, 8)], {"a": [-1, -1]})
    assert scheduler.kv_cache_manager.get_block_ids("a") == ([1, 2, 3],)
    assert request.spec_token_ids == []
    update(scheduler, out2, {"a": [11, 12, 13]})
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    engine_outputs = update(scheduler, out3, {"a": [14, 15, 16]})
    assert engine_outputs.outputs == [output("a", [14, 15, 16], FinishReason.LENGTH)]
    assert request.num_tokens == 12


class OpenGrammars:
    """A stand-in for the StructuredOutputManager: every grammar is compiled at once and
    takes every token."""

    def grammar_init(self, request):
        future = concurrent.futures.Future()
        future.set_result(None)
        request.structured_output_request = StructuredOutputRequest(request.sampling_params.structured_outputs, future)

    def is_ready(self, request):
        return True

    def compile_error(self, request):
        return None

    def accept_tokens(self, request, token_ids):
        return False


def test_a_constrained_request_gets_no_drafts():
    scheduler = make_spec_scheduler()
    scheduler.structured_output_manager = OpenGrammars()
    scheduler.add_request(make_request("c", [1, 2, 3], structured_outputs=StructuredOutputsParams(regex="[a-z]+")))
    scheduler.add_request(make_request("f", [1, 2, 3]))
    out1 = scheduler.schedule()
    assert [scheduler.requests[r].spec_token_ids for r in ("c", "f")] == [[], [-1, -1]]
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens == {"c": 1, "f": 3}
    assert out2.scheduled_spec_decode_tokens == {"f": [-1, -1]}
    assert scheduler.num_output_placeholders == {"c": 2, "f": 4}
    update(scheduler, out1, {"c": [7], "f": [8]})
    update(scheduler, out2, {"c": [9], "f": [10, 11, 12]})
    assert scheduler.spec_decoding_stats == SpecDecodingStats(1, 2, 2, (1, 1))


def test_drafts_start_once_min_tokens_are_out_or_in_flight():
    scheduler = make_spec_scheduler()
    request = make_request("a", PROMPT, min_tokens=3)
    scheduler.add_request(request)
    out1, out2 = scheduler.schedule(), scheduler.schedule()
    update(scheduler, out1, {"a": [10]})
    # The step scheduled now brings the 3rd output: the one after may verify drafts.
    out3 = scheduler.schedule()
    assert request.spec_token_ids == [-1, -1]
    update(scheduler, out2, {"a": [11]})
    out4 = scheduler.schedule()
    specs = [out.scheduled_spec_decode_tokens for out in (out1, out2, out3, out4)]
    assert specs == [{}, {}, {}, {"a": [-1, -1]}]
    assert [cached(out) for out in (out2, out3, out4)] == [[("a", None, 5)], [("a", ([3],), 6)], [("a", None, 7)]]


def test_a_request_left_out_of_a_step_comes_back_without_drafts():
    # The drafts proposed after a step are for the next step only.
    scheduler = make_spec_scheduler(max_num_batched_tokens=1 + K)
    a, b = make_request("a", [10]), make_request("b", [20])
    scheduler.add_request(a)
    scheduler.add_request(b)
    out1 = scheduler.schedule()
    assert out1.num_scheduled_tokens == {"a": 1, "b": 1}
    assert (a.spec_token_ids, b.spec_token_ids) == ([-1, -1], [-1, -1])
    # a's bonus token and drafts take the whole budget: b is left out, its drafts dropped.
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens == {"a": 1 + K}
    assert (b.status, b.spec_token_ids) == (RequestStatus.RUNNING, [])
    update(scheduler, out1, {"a": [11], "b": [21]})
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    out3 = scheduler.schedule()
    assert (out3.num_scheduled_tokens, out3.scheduled_spec_decode_tokens) == ({"b": 1}, {})
    assert b.spec_token_ids == [-1, -1]


def test_a_request_preempted_with_drafts_in_flight_takes_back_only_its_placeholders():
    scheduler = make_spec_scheduler(num_gpu_blocks=8, max_model_len=16, max_num_batched_tokens=16)
    a = make_request("a", [10, 11, 12, 13, 14, 15], max_tokens=None)
    b = make_request("b", [20, 21, 22, 23, 24, 25], max_tokens=None)
    scheduler.add_request(a)
    scheduler.add_request(b)
    out1, out2 = scheduler.schedule(), scheduler.schedule()
    assert out2.scheduled_spec_decode_tokens == {"a": [-1, -1], "b": [-1, -1]}
    update(scheduler, out1, {"a": [30], "b": [40]})
    # a takes the last free block; b needs one too and preempts itself, its drafts in flight.
    out3 = scheduler.schedule()
    assert out3.num_scheduled_tokens == {"a": 3}
    assert (b.status, b.num_computed_tokens, b.spec_token_ids) == (RequestStatus.PREEMPTED, 0, [])
    assert scheduler.num_output_placeholders == {"a": 6, "b": 3}
    assert num_free_blocks(scheduler) == 3
    # b's step rejects both drafts: its placeholders go, its computed tokens stay at 0.
    update(scheduler, out2, {"a": [31, 32, 33], "b": [41]})
    assert (b.num_computed_tokens, b.output_token_ids) == (0, [40, 41])
    assert scheduler.num_output_placeholders == {"a": 3, "b": 0}
    assert scheduler.spec_decoding_stats == SpecDecodingStats(2, 4, 2, (1, 1))
    # b resumes from its cached first block, with all its tokens known.
    out4 = scheduler.schedule()
    assert out4.num_scheduled_tokens == {"a": 3, "b": 4}
    assert cached(out4) == [("a", None, 12), ("b", ([3, 6, 4],), 4)]
    assert out4.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert (b.num_computed_tokens, b.spec_token_ids, scheduler.num_output_placeholders["b"]) == (8, [-1, -1], 1)
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert (num_free_blocks(scheduler), scheduler.num_output_placeholders) == (7, {})
    assert update(scheduler, out3, {"a": [34, 35, 36]}) == EngineCoreOutputs([], {"a", "b"})
    assert update(scheduler, out4, {"a": [37], "b": [42]}) == EngineCoreOutputs([], set())


def test_an_abort_with_drafts_in_flight_frees_everything_at_once():
    scheduler = make_spec_scheduler()
    _, out1, out2 = started(scheduler, max_tokens=20)
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert (num_free_blocks(scheduler), scheduler.num_output_placeholders) == (16, {})
    assert update(scheduler, out1, {"a": [10]}) == EngineCoreOutputs([], {"a"})
    assert update(scheduler, out2, {"a": [11, 12, 13]}) == EngineCoreOutputs([], set())
    assert scheduler.spec_decoding_stats == SpecDecodingStats()


def test_max_tokens_cuts_the_drafts_and_per_request_metrics_count_each_verify_step():
    scheduler = make_spec_scheduler(metrics="detailed")
    _, out1, out2 = started(scheduler, max_tokens=6)
    update(scheduler, out1, {"a": [10]})
    # Counting the tokens in flight as accepted, the 4th and 5th outputs are on the way:
    # one draft is left before the 6th.
    out3 = scheduler.schedule()
    assert out3.scheduled_spec_decode_tokens == {"a": [-1]}
    update(scheduler, out2, {"a": [11, 20]})
    out4 = scheduler.schedule()
    assert (out4.num_scheduled_tokens, out4.scheduled_spec_decode_tokens) == ({"a": 1}, {})
    update(scheduler, out3, {"a": [21, 22]})
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    [finished] = update(scheduler, out4, {"a": [23]}).outputs
    assert (finished.new_token_ids, finished.finish_reason) == ([23], FinishReason.LENGTH)
    metrics = finished.spec_decode_metrics.to_dict()
    assert (metrics["per_step_drafted"], metrics["per_step_accepted"]) == ([2, 1], [1, 1])
    assert metrics["acceptance_histogram"] == [0, 2, 0]
    assert scheduler.make_stats().spec_decoding_stats == SpecDecodingStats(2, 3, 2, (2, 0))


EOS = 5
VOCAB_SIZE = 29
MAX_MODEL_LEN = 24


def target_token(token_ids: list[int]) -> int:
    """A deterministic stand-in for the model: the next token depends on every token before."""
    return (sum((i + 3) * t for i, t in enumerate(token_ids)) + len(token_ids)) % VOCAB_SIZE + 1


def draft_token(token_ids: list[int]) -> int:
    """The drafter's guess: right at two positions in three."""
    token = target_token(token_ids)
    return token if (len(token_ids) + token_ids[0]) % 3 else token % VOCAB_SIZE + 1


class FakeSpecRunner:
    """Keeps each request's true tokens and computed count as the device would: it drafts,
    verifies and places the next step's tokens where the last one's accepted drafts end,
    whatever the scheduler counted in flight. It checks every step's slots."""

    def __init__(self) -> None:
        self.token_ids: dict[str, list[int]] = {}
        self.block_ids: dict[str, list[int]] = {}
        self.num_computed_tokens: dict[str, int] = {}

    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for new in out.scheduled_new_reqs:
            self.token_ids[new.req_id] = list(new.prompt_token_ids)
            self.block_ids[new.req_id] = list(new.block_ids[0])
            self.num_computed_tokens[new.req_id] = new.num_computed_tokens
        data = out.scheduled_cached_reqs
        for req_id, resumed, new_block_ids, num_computed in zip(
            data.req_ids, data.resumed_from_preemption, data.new_block_ids, data.num_computed_tokens
        ):
            kept = [] if resumed else self.block_ids[req_id]
            self.block_ids[req_id] = kept + (list(new_block_ids[0]) if new_block_ids else [])
            if resumed:
                self.num_computed_tokens[req_id] = num_computed
            # The scheduler counts the drafts in flight as accepted: it may be ahead, never behind.
            assert 0 <= num_computed - self.num_computed_tokens[req_id] <= K
        sampled = {}
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            num_drafts = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
            sampled_token_ids = self._run(req_id, num_tokens, num_drafts)
            if sampled_token_ids:
                sampled[req_id] = sampled_token_ids
        return runner_output(out, sampled)

    def _run(self, req_id: str, num_tokens: int, num_drafts: int) -> list[int]:
        token_ids = self.token_ids[req_id]
        end = self.num_computed_tokens[req_id] + num_tokens
        num_slots = len(self.block_ids[req_id]) * BLOCK_SIZE
        # Every position, the drafter's lookahead ones included, has a slot below max_model_len.
        assert end <= MAX_MODEL_LEN and min(end + K, MAX_MODEL_LEN) <= num_slots
        if end - num_drafts < len(token_ids):
            assert num_drafts == 0, "drafts come only after the request's last token"
            self.num_computed_tokens[req_id] = end
            return []
        assert end - num_drafts == len(token_ids)
        drafts = []
        for _ in range(num_drafts):
            drafts.append(draft_token(token_ids + drafts))
        num_accepted = 0
        while num_accepted < num_drafts and drafts[num_accepted] == target_token(token_ids + drafts[:num_accepted]):
            num_accepted += 1
        sampled = drafts[:num_accepted] + [target_token(token_ids + drafts[:num_accepted])]
        self.num_computed_tokens[req_id] = len(token_ids) + num_accepted
        token_ids += sampled
        return sampled


def run(scheduler: AsyncScheduler) -> dict[str, tuple]:
    """Drive the scheduler like EngineCore's batch queue of two; return each request's outputs."""
    runner, batch_queue = FakeSpecRunner(), collections.deque()
    results = collections.defaultdict(list)
    for _ in range(1000):
        if not (scheduler.has_unfinished_requests() or batch_queue):
            return dict(results)
        if scheduler.has_unfinished_requests():
            out = scheduler.schedule()
            batch_queue.append((out, runner.execute_model(out)))
            if len(batch_queue) < 2 and out.total_num_scheduled_tokens:
                continue
        for engine_output in scheduler.update_from_output(*batch_queue.popleft()).outputs:
            results[engine_output.request_id] += engine_output.new_token_ids
            if engine_output.finished:
                results[engine_output.request_id] = (
                    tuple(results[engine_output.request_id]),
                    engine_output.finish_reason,
                )
    raise AssertionError("the requests never finished")


def expected_outputs(prompt: list[int], max_tokens: int) -> tuple:
    token_ids, output_ids = list(prompt), []
    while True:
        output_ids.append(target_token(token_ids))
        token_ids.append(output_ids[-1])
        if output_ids[-1] == EOS:
            return tuple(output_ids), FinishReason.STOP
        if len(output_ids) == max_tokens or len(token_ids) == MAX_MODEL_LEN:
            return tuple(output_ids), FinishReason.LENGTH


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_speculative_async_scheduling_gives_the_outputs_of_greedy_decoding(policy):
    shared = [1, 2, 3, 4, 6, 7, 8, 9]
    prompts = [shared[: 3 + i % 6] + [10 + i] * (i % 5) for i in range(16)]
    max_tokens = [4 + (7 * i) % 19 for i in range(16)]
    expected = {f"r{i}": expected_outputs(p, m) for i, (p, m) in enumerate(zip(prompts, max_tokens))}
    reasons = collections.Counter(reason for _, reason in expected.values())
    assert reasons[FinishReason.STOP] >= 3 and reasons[FinishReason.LENGTH] >= 3
    assert sum(len(p) + len(o) == MAX_MODEL_LEN for p, (o, _) in zip(prompts, expected.values())) >= 3
    scheduler = make_spec_scheduler(
        num_gpu_blocks=9, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=12, max_num_seqs=4, policy=policy
    )
    for i, (prompt, num_tokens) in enumerate(zip(prompts, max_tokens)):
        scheduler.add_request(make_request(f"r{i}", prompt, eos_token_id=EOS, max_tokens=num_tokens, priority=i % 3))
    assert run(scheduler) == expected
    stats = scheduler.spec_decoding_stats
    assert scheduler.num_preemptions > 0
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.num_accepted_tokens_per_pos[0] > stats.num_accepted_tokens_per_pos[1] > 0
    assert num_free_blocks(scheduler) == 8
    assert (scheduler.kv_cache_manager.req_to_blocks, scheduler.num_output_placeholders) == ({}, {})
