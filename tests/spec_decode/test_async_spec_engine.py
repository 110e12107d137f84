"""Speculative decoding with async scheduling, end to end through `LLM`: the drafter runs
right after each step on the device and the next step, packed before this one is back,
corrects its optimistic positions by the drafts this one rejected. The outputs are the ones
without speculation (greedy and seeded random sampling), with chunked prefill and preemption
during the run; the target as its own draft model has every draft accepted, and an EAGLE-3
head (random weights, drafts mostly rejected) exercises the corrections on almost every step."""

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
    SamplingParams(max_tokens=48, temperature=0.0),
    SamplingParams(max_tokens=40, temperature=0.8, top_k=50, presence_penalty=0.4, seed=11),
)


def _token_ids(llm: LLM, params: SamplingParams) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(_PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def reference(target) -> list[list[int]]:
    llm = LLM(target, **ENGINE_ARGS)
    try:
        return [_token_ids(llm, params) for params in _PARAMS]
    finally:
        llm.shutdown()


def _run(target: str, speculative_config: dict):
    """The tokens per sampling params, the spec decode stats after the greedy run, and the
    preemptions of both."""
    llm = LLM(target, speculative_config=speculative_config, async_scheduling=True, **ENGINE_ARGS)
    try:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        token_ids = [_token_ids(llm, _PARAMS[0])]
        greedy_stats = scheduler.spec_decoding_stats
        token_ids.append(_token_ids(llm, _PARAMS[1]))
        return token_ids, greedy_stats, scheduler.num_preemptions
    finally:
        llm.shutdown()


def test_the_target_as_its_own_draft_has_every_draft_accepted(target, reference):
    config = {"method": "draft_model", "model": target, "num_speculative_tokens": _K}
    token_ids, greedy_stats, num_preemptions = _run(target, config)
    assert token_ids == reference
    assert num_preemptions > 0
    # Greedy drafts are all accepted (the seeded requests' drafts, the draft model's argmax,
    # only when the target draws them).
    assert greedy_stats.num_draft_tokens > 0
    assert greedy_stats.num_accepted_tokens == greedy_stats.num_draft_tokens


def test_an_eagle3_head_gives_the_outputs_without_speculation(target, reference, tmp_path):
    head = save_eagle3_head(tmp_path / "eagle3", target)
    token_ids, greedy_stats, _ = _run(target, {"method": "eagle3", "model": head, "num_speculative_tokens": _K})
    assert token_ids == reference
    assert greedy_stats.num_drafts > 0
