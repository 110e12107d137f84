"""Per-request speculative decoding metrics (vLLM's `per_request_spec_decode_metrics`) without an
engine: the accumulator's figures, the scheduler that keeps one per request and sends it with
the request's finishing output only, its trip over the engine's wire format, and the argument."""

import dataclasses

import pytest

import vjx
from tests.helpers.scheduler import make_request, make_scheduler, runner_output
from vjx.core.request import RequestStatus
from vjx.core.sched.scheduler import Scheduler
from vjx.engine import serial
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vjx.spec_decode.request_metrics import RequestSpecDecodeMetrics
from vjx.utils.argparse_utils import FlexibleArgumentParser

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def test_a_request_without_verify_steps_has_a_histogram_of_zeros():
    assert RequestSpecDecodeMetrics.new(3).to_dict() == {
        "mean_acceptance_length": 1.0,
        "draft_acceptance_rate": 0.0,
        "acceptance_histogram": [0, 0, 0, 0],
        "num_spec_steps": 0,
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 0,
        "num_spec_tokens": 3,
    }


@pytest.mark.parametrize("detailed", [False, True])
def test_the_figures_count_accepted_drafts_per_verify_step(detailed):
    metrics = RequestSpecDecodeMetrics.new(3)
    for num_draft_tokens, num_accepted in [(3, 3), (3, 0), (2, 1), (3, 3)]:
        metrics.observe(num_draft_tokens, num_accepted, detailed)
    expected = {
        # 7 drafts accepted over 4 steps; each step also keeps its bonus token.
        "mean_acceptance_length": 1.0 + 7 / 4,
        "draft_acceptance_rate": 7 / 11,
        "acceptance_histogram": [1, 1, 0, 2],
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 7,
        "num_draft_tokens": 11,
        "num_spec_tokens": 3,
    }
    if detailed:
        expected |= {"per_step_accepted": [3, 0, 1, 3], "per_step_drafted": [3, 3, 2, 3]}
    assert metrics.to_dict() == expected


def test_the_metrics_cross_the_wire_inside_an_engine_core_output():
    metrics = RequestSpecDecodeMetrics(2, [1, 0, 1], 4, [2, 0], [2, 2])
    outputs = EngineCoreOutputs([EngineCoreOutput("a", [5, 6, 7], FinishReason.LENGTH, spec_decode_metrics=metrics)])
    kind, decoded = serial.decode(serial.encode(b"token", serial.OUTPUTS, outputs), [b"token"], serial.OUTPUT_KINDS)
    assert kind == serial.OUTPUTS and decoded == outputs
    assert isinstance(decoded.outputs[0].spec_decode_metrics, RequestSpecDecodeMetrics)


def _scheduler(level: str) -> Scheduler:
    base = make_scheduler(max_model_len=64)
    config = dataclasses.replace(base.scheduler_config, num_spec_tokens=3, per_request_spec_decode_metrics=level)
    return Scheduler(config, base.cache_config, base.kv_cache_config)


def _step(scheduler: Scheduler, sampled: dict[str, list[int]], drafts: dict[str, list[int]]) -> dict:
    """One step that samples `sampled`, after which the runner proposes `drafts`; its outputs by id."""
    out = scheduler.schedule()
    result = runner_output(out, sampled)
    result.spec_token_ids = [drafts.get(req_id, []) for req_id in result.req_ids]
    return {o.request_id: o for o in scheduler.update_from_output(out, result).outputs}


def _run(scheduler: Scheduler) -> list[dict]:
    """Request "a" (max_tokens=7): a prefill, a step accepting 2 of 3 drafts, one without
    drafts, one accepting its only draft (the last token it may keep)."""
    scheduler.add_request(make_request("a", [1, 2, 3, 4], max_tokens=7))
    return [
        _step(scheduler, {"a": [5]}, {"a": [6, 7, 8]}),
        _step(scheduler, {"a": [6, 7, 9]}, {}),
        _step(scheduler, {"a": [10]}, {"a": [11]}),
        _step(scheduler, {"a": [11, 12]}, {}),
    ]


@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_the_scheduler_sends_a_requests_metrics_with_its_finishing_output(level):
    outputs = _run(_scheduler(level))
    assert [o["a"].spec_decode_metrics for o in outputs[:-1]] == [None] * 3
    last = outputs[-1]["a"]
    assert last.finish_reason == FinishReason.LENGTH and last.new_token_ids == [11, 12]
    is_detailed = level == "detailed"
    assert last.spec_decode_metrics == RequestSpecDecodeMetrics(
        3, [0, 1, 1, 0], 4, [2, 1] if is_detailed else [], [3, 1] if is_detailed else []
    )


def test_the_scheduler_keeps_no_metrics_at_none():
    scheduler = _scheduler("none")
    assert all(o["a"].spec_decode_metrics is None for o in _run(scheduler))
    assert scheduler.spec_decoding_stats.num_drafts == 2


def test_an_aborted_request_sends_no_metrics():
    scheduler = _scheduler("summary")
    scheduler.add_request(make_request("a", [1, 2, 3, 4]))
    _step(scheduler, {"a": [5]}, {"a": [6, 7, 8]})
    _step(scheduler, {"a": [6, 9]}, {"a": [1]})
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    out = scheduler.schedule()
    update = scheduler.update_from_output(out, runner_output(out, {}))
    assert update.outputs == [] and update.finished_requests == {"a"}


def test_the_argument_takes_vllms_levels_and_needs_speculative_decoding():
    args = vjx.EngineArgs(speculative_config=NGRAM, per_request_spec_decode_metrics="summary")
    assert args.per_request_spec_decode_metrics == "summary"
    assert vjx.EngineArgs().per_request_spec_decode_metrics == "none"
    with pytest.raises(ValueError, match=r"^per_request_spec_decode_metrics must be one of \['none', 'summary', "):
        vjx.EngineArgs(speculative_config=NGRAM, per_request_spec_decode_metrics="full")
    with pytest.raises(ValueError, match="^per_request_spec_decode_metrics='detailed' needs speculative decoding"):
        vjx.EngineArgs(per_request_spec_decode_metrics="detailed")


def test_the_flag_reaches_the_engine_args():
    parser = vjx.EngineArgs.add_cli_args(FlexibleArgumentParser())
    flags = ["--per-request-spec-decode-metrics", "detailed", "--spec-method", "ngram", "--spec-tokens", "2"]
    args = vjx.EngineArgs.from_cli_args(parser.parse_args(flags))
    assert args.per_request_spec_decode_metrics == "detailed"
