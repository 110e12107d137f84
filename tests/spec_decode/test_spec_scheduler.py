"""The scheduler with drafts: they are scheduled as ordinary tokens after the request's own,
trimmed to the token budget and max_model_len, and the rejected ones are uncomputed again
when the step's tokens come back; the counts reach the stats."""

from tests.helpers.scheduler import make_request, make_scheduler, runner_output
from vjx.core.sched.scheduler import _StepPlan
from vjx.core.sched.stats import SpecDecodingStats


def _decode_step(scheduler, sampled, drafts):
    """One step that samples `sampled`, after which the runner proposes `drafts`, per request."""
    out = scheduler.schedule()
    result = runner_output(out, sampled)
    result.spec_token_ids = [drafts.get(req_id, []) for req_id in result.req_ids]
    scheduler.update_from_output(out, result)
    return out


def _running(scheduler, drafts=(6, 7, 8), **params):
    scheduler.add_request(make_request("a", [1, 2, 3, 4], **params))
    _decode_step(scheduler, {"a": [5]}, {"a": list(drafts)})
    return scheduler.requests["a"]


def test_drafts_are_scheduled_after_the_last_token_and_rejected_ones_uncomputed():
    scheduler = make_scheduler(max_model_len=64)
    request = _running(scheduler)
    assert request.spec_token_ids == [6, 7, 8] and request.num_computed_tokens == 4
    # The last token and three drafts; the step accepts 6 and 7, then draws 9 instead of 8.
    out = _decode_step(scheduler, {"a": [6, 7, 9]}, {"a": [1, 2]})
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [6, 7, 8]}
    assert request.output_token_ids == [5, 6, 7, 9]
    # Computed: the prompt, 5, 6 and 7 (8 was rejected; 9 is the next step's input).
    assert request.num_computed_tokens == 7 == request.num_tokens - 1
    assert request.spec_token_ids == [1, 2]
    assert scheduler.spec_decoding_stats == SpecDecodingStats(1, 3, 2, (1, 1, 0))
    stats = scheduler.make_stats()
    assert stats.spec_decoding_stats.num_accepted_tokens == 2
    assert "Mean acceptance length: 3.00" in str(stats)


def test_drafts_are_trimmed_to_the_token_budget_and_max_model_len():
    scheduler = make_scheduler(max_model_len=64, max_num_batched_tokens=4)
    _running(scheduler, drafts=(6, 7, 8, 9))
    out = _decode_step(scheduler, {"a": [6, 7, 8, 1]}, {})
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [6, 7, 8]}

    scheduler = make_scheduler(max_model_len=7)
    _running(scheduler)
    out = _decode_step(scheduler, {"a": [6, 1]}, {})
    # Positions 4 to 6: the last token and two drafts stay below max_model_len.
    assert out.num_scheduled_tokens == {"a": 3}
    assert out.scheduled_spec_decode_tokens == {"a": [6, 7]}


def test_a_request_that_stops_inside_its_accepted_drafts_keeps_tokens_up_to_the_stop():
    scheduler = make_scheduler(max_model_len=64)
    request = _running(scheduler, max_tokens=3)
    _decode_step(scheduler, {"a": [6, 7, 8, 9]}, {"a": [1]})
    assert request.output_token_ids == [5, 6, 7]
    assert "a" not in scheduler.requests and request.spec_token_ids == []


def test_preemption_drops_the_drafts():
    scheduler = make_scheduler(max_model_len=64)
    request = _running(scheduler)
    scheduler._preempt(request, _StepPlan(token_budget=0))
    assert request.spec_token_ids == [] and request.num_computed_tokens == 0
