"""Speculative decoding with the n-gram proposer, end to end through `LLM`: the outputs are
the ones the engine gives without speculation (greedy, and seeded random sampling with
filters and penalties: a seeded request draws the same tokens), with logprobs, n > 1,
chunked prefill, prefix caching and preemption happening during the run; drafts are accepted
on prompts that repeat."""

import re

import numpy as np
import pytest

from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams
from vjx.sampling_params import StructuredOutputsParams

# A small pool (40 blocks of 16 tokens) and budget: the batch below preempts and chunks.
ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, num_gpu_blocks_override=40, seed=0)
SPECULATIVE_CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
_REPEATING = [
    "one two three four one two three four one two three four one two",
    "a b c d e f a b c d e f a b c d e f a b",
    "the cat sat on the mat and the cat sat on the mat and the cat",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3",
]
_CASES = {
    "greedy": (_REPEATING, SamplingParams(max_tokens=48, temperature=0.0)),
    "seeded": (
        _REPEATING,
        SamplingParams(
            max_tokens=40,
            temperature=0.8,
            top_k=50,
            top_p=0.95,
            presence_penalty=0.4,
            frequency_penalty=0.2,
            repetition_penalty=1.1,
            seed=11,
        ),
    ),
    "logprobs": (_REPEATING[:2], SamplingParams(max_tokens=24, temperature=0.0, logprobs=3)),
    "n2": (_REPEATING[:2], SamplingParams(max_tokens=24, temperature=1.0, n=2, seed=5)),
    # The grammar's mask applies at every draft's position: n-gram drafts that follow the
    # regex are accepted, and the output is the constrained one without speculation.
    "structured": (
        _REPEATING[:1],
        SamplingParams(
            max_tokens=40, temperature=0.0, structured_outputs=StructuredOutputsParams(regex="( one two three four)+")
        ),
    ),
    "structured_seeded": (
        _REPEATING[1:2],
        SamplingParams(
            max_tokens=30, temperature=1.0, seed=9, structured_outputs=StructuredOutputsParams(regex="( [a-f])+")
        ),
    ),
    # Eight long requests at once: 40 blocks cannot hold them all, so some are preempted.
    "preempted": ([p + " " + p for p in _REPEATING] * 2, SamplingParams(max_tokens=64, temperature=0.0)),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny"))


def _run_cases(llm: LLM) -> dict:
    return {name: llm.generate(prompts, params, use_tqdm=False) for name, (prompts, params) in _CASES.items()}


@pytest.fixture(scope="module")
def reference(model) -> dict:
    llm = LLM(model, **ENGINE_ARGS)
    try:
        return _run_cases(llm)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def speculative(model, reference):
    """The speculative engine's outputs for every case, and its scheduler's totals."""
    llm = LLM(model, speculative_config=SPECULATIVE_CONFIG, **ENGINE_ARGS)
    try:
        outputs = _run_cases(llm)
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        return outputs, scheduler.spec_decoding_stats, scheduler.num_preemptions
    finally:
        llm.shutdown()


def _token_ids(outputs) -> list[list[list[int]]]:
    return [[list(completion.token_ids) for completion in output.outputs] for output in outputs]


@pytest.mark.parametrize("case", list(_CASES))
def test_outputs_are_the_ones_without_speculation(reference, speculative, case):
    outputs, _, _ = speculative
    assert _token_ids(outputs[case]) == _token_ids(reference[case])
    assert [o.outputs[0].finish_reason for o in outputs[case]] == [o.outputs[0].finish_reason for o in reference[case]]


def test_drafts_are_accepted_and_preemption_happened(speculative):
    _, stats, num_preemptions = speculative
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert len(stats.num_accepted_tokens_per_pos) == SPECULATIVE_CONFIG["num_speculative_tokens"]
    assert num_preemptions > 0


def test_no_per_request_metrics_by_default(speculative):
    outputs, _, _ = speculative
    assert all(c.spec_decode_metrics is None for case in outputs.values() for o in case for c in o.outputs)


def test_logprobs_of_accepted_tokens_are_the_ones_without_speculation(reference, speculative):
    outputs, _, _ = speculative
    for spec, ref in zip(outputs["logprobs"], reference["logprobs"]):
        spec_lp, ref_lp = spec.outputs[0].logprobs, ref.outputs[0].logprobs
        assert len(spec_lp) == len(ref_lp) == len(ref.outputs[0].token_ids)
        for spec_position, ref_position in zip(spec_lp, ref_lp):
            assert spec_position.keys() == ref_position.keys()
            np.testing.assert_allclose(
                [p.logprob for p in spec_position.values()], [p.logprob for p in ref_position.values()], atol=1e-4
            )


def test_structured_outputs_follow_their_grammar_with_drafts_accepted(speculative):
    outputs, _, _ = speculative
    assert outputs["structured"][0].outputs[0].text.startswith(" one two three four one two")
    # Cut by max_tokens: a prefix of the regex's language.
    assert re.fullmatch(r"( [a-f])+ ?", outputs["structured_seeded"][0].outputs[0].text)
