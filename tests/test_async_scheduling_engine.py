"""Async scheduling (a step scheduled while the previous one runs) gives the outputs of sync
scheduling: greedy and seeded sampling, stops that land while a step is in flight, and
constrained rows (whose masks wait for the step in flight) beside free ones.

It runs the tiny stand-in for the default model (the property is the engine's, not the
model's): one engine at a time, the sync one first, then the async one on the same prompts.
The stand-in never samples its EOS, so stop tokens picked from the sync run's own greedy
tokens stand in for it.
"""

import json
import re

import pytest

from tests.helpers.large_engine import PROMPTS
from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from vjx import LLM, SamplingParams
from vjx.sampling_params import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
    "additionalProperties": False,
}


def _requests(stop_token_ids: list[int]) -> list[tuple[list[str], list[SamplingParams] | SamplingParams]]:
    constrained = [
        SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
        SamplingParams(temperature=0.7, seed=5, max_tokens=40),
        SamplingParams(
            temperature=0.9, seed=3, max_tokens=20, structured_outputs=StructuredOutputsParams(regex="[a-z]{3,9}")
        ),
    ] * 2
    return [
        (PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)),
        (PROMPTS[:6], SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=stop_token_ids)),
        (PROMPTS[:6], SamplingParams(temperature=0.7, seed=3, max_tokens=30, stop_token_ids=stop_token_ids)),
        (PROMPTS[:6], constrained),
    ]


def _run(llm: LLM, stop_token_ids: list[int]) -> list[list[tuple[list[int], str, str | None]]]:
    results = []
    for prompts, params in _requests(stop_token_ids):
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results.append([(list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs])
    return results


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))


@pytest.fixture(scope="module")
def runs(model):
    """(sync outputs, async outputs, the stop tokens both used)."""
    outputs = {}
    stop_token_ids = None
    for async_scheduling in (False, True):
        llm = LLM(model=model, **TINY_DEFAULT_ARGS, async_scheduling=async_scheduling)
        try:
            if stop_token_ids is None:
                greedy = llm.generate(PROMPTS[:6], SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)
                # Tokens some prompts reach mid-way: their stops land at different steps.
                stop_token_ids = sorted({greedy[i].outputs[0].token_ids[5 + 7 * i] for i in (0, 1, 2)})
            outputs[async_scheduling] = _run(llm, stop_token_ids)
        finally:
            llm.shutdown()
    return outputs[False], outputs[True], stop_token_ids


def test_async_outputs_equal_sync(runs):
    sync, async_, _ = runs
    assert async_ == sync


def test_stop_tokens_end_some_greedy_requests_early(runs):
    sync, _, stop_token_ids = runs
    greedy = sync[1]
    stopped = [tokens for tokens, _, reason in greedy if reason == "stop"]
    assert len(stopped) >= 3 and all(tokens[-1] in stop_token_ids for tokens in stopped)
    assert len({len(tokens) for tokens in stopped}) > 1
    assert any(reason == "length" for _, _, reason in greedy)


def test_constrained_rows_follow_their_constraints(runs):
    _, async_, _ = runs
    constrained = async_[3]
    for _, text, reason in constrained[::3]:
        assert reason == "stop"
        assert set(json.loads(text)) == {"n"}
    assert all(re.fullmatch("[a-z]{3,9}", text) for _, text, _ in constrained[2::3])
