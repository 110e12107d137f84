"""Speculative decoding with async scheduling, end to end through `LLM`: the drafter runs
right after each step on the device and the next step, packed before this one is back,
corrects its optimistic positions by the drafts this one rejected. The outputs are the ones
without speculation (greedy and seeded random sampling), with chunked prefill and preemption
during the run; the target as its own draft model has every draft accepted, and an EAGLE-3
head (random weights, drafts mostly rejected) exercises the corrections on almost every step."""

import numpy as np
import pytest

from tests.helpers.eagle_head import save_eagle3_head
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams

# A small pool (20 blocks of 16 tokens) and budget: the batch preempts and chunks.
ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, num_gpu_blocks_override=20, seed=0)
_K = 3
_PROMPTS = [
    "one two three four one two three four one two three four one two",
    "a b c d e f a b c d e f a b c d e f a b",
    "The capital of France is",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3",
] * 2
_PARAMS = (
    SamplingParams(max_tokens=48, temperature=0.0, logprobs=2),
    SamplingParams(max_tokens=40, temperature=0.8, top_k=50, presence_penalty=0.4, seed=11),
)


def _generate(llm: LLM, params: SamplingParams) -> list:
    return [o.outputs[0] for o in llm.generate(_PROMPTS, params, use_tqdm=False)]


def _assert_same(outputs: list[list], reference: list[list]) -> None:
    """The same tokens per request, and for the greedy ones (logprobs=2) the same logprobs."""
    assert [[list(o.token_ids) for o in run] for run in outputs] == [
        [list(o.token_ids) for o in run] for run in reference
    ]
    for output, ref in zip(outputs[0], reference[0]):
        assert len(output.logprobs) == len(ref.logprobs) == len(ref.token_ids)
        for position, ref_position in zip(output.logprobs, ref.logprobs):
            assert position.keys() == ref_position.keys()
            np.testing.assert_allclose(
                [p.logprob for p in position.values()], [p.logprob for p in ref_position.values()], atol=1e-4
            )


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def reference(target) -> list[list]:
    llm = LLM(target, **ENGINE_ARGS)
    try:
        return [_generate(llm, params) for params in _PARAMS]
    finally:
        llm.shutdown()


def _run(target: str, speculative_config: dict):
    """The outputs per sampling params, the spec decode stats after the greedy run, and the
    preemptions of both."""
    llm = LLM(target, speculative_config=speculative_config, async_scheduling=True, **ENGINE_ARGS)
    try:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        outputs = [_generate(llm, _PARAMS[0])]
        greedy_stats = scheduler.spec_decoding_stats
        outputs.append(_generate(llm, _PARAMS[1]))
        return outputs, greedy_stats, scheduler.num_preemptions
    finally:
        llm.shutdown()


def test_the_target_as_its_own_draft_has_every_draft_accepted(target, reference):
    config = {"method": "draft_model", "model": target, "num_speculative_tokens": _K}
    outputs, greedy_stats, num_preemptions = _run(target, config)
    _assert_same(outputs, reference)
    assert num_preemptions > 0
    # Greedy drafts are all accepted (the seeded requests' drafts, the draft model's argmax,
    # only when the target draws them).
    assert greedy_stats.num_draft_tokens > 0
    assert greedy_stats.num_accepted_tokens == greedy_stats.num_draft_tokens


def test_an_eagle3_head_gives_the_outputs_without_speculation(target, reference, tmp_path):
    head = save_eagle3_head(tmp_path / "eagle3", target)
    outputs, greedy_stats, _ = _run(target, {"method": "eagle3", "model": head, "num_speculative_tokens": _K})
    _assert_same(outputs, reference)
    assert greedy_stats.num_drafts > 0
