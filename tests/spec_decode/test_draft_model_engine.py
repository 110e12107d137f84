"""Speculative decoding with a draft model, end to end through `LLM`: a smaller random model
(one layer, other weights) as the draft leaves the outputs as they are without speculation;
the target itself as its own draft proposes exactly its greedy tokens, so every draft of a
greedy request is accepted."""

import pytest

from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams

ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, num_gpu_blocks_override=60, seed=0)
_PROMPTS = [
    "one two three four one two three four one two three four one two",
    "a b c d e f a b c d e f a b c d e f a b",
    "The capital of France is",
]
_GREEDY = SamplingParams(max_tokens=40, temperature=0.0)
_SEEDED = SamplingParams(max_tokens=32, temperature=0.9, top_p=0.9, presence_penalty=0.3, seed=3, logprobs=2)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    target = save_tiny_default_model(tmp_path_factory.mktemp("target"))
    draft = save_tiny_default_model(tmp_path_factory.mktemp("draft"), seed=1, num_hidden_layers=1)
    return target, draft


def _generate(target: str, speculative_config=None):
    """Greedy and seeded outputs, and the scheduler's speculative counts."""
    llm = LLM(target, speculative_config=speculative_config, **ENGINE_ARGS)
    try:
        outputs = [llm.generate(_PROMPTS, params, use_tqdm=False) for params in (_GREEDY, _SEEDED)]
        return outputs, llm.llm_engine.engine_core.engine_core.scheduler.spec_decoding_stats
    finally:
        llm.shutdown()


def _token_ids(outputs) -> list[list[list[int]]]:
    return [[list(o.outputs[0].token_ids) for o in step] for step in outputs]


@pytest.fixture(scope="module")
def reference(models):
    return _generate(models[0])[0]


def test_a_smaller_draft_model_leaves_the_outputs_unchanged(models, reference):
    target, draft = models
    outputs, stats = _generate(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": 3})
    assert _token_ids(outputs) == _token_ids(reference)
    for spec, ref in zip(outputs[1], reference[1]):
        assert [list(p) for p in spec.outputs[0].logprobs] == [list(p) for p in ref.outputs[0].logprobs]
    assert stats.num_drafts > 0


def test_the_target_as_its_own_draft_has_every_greedy_draft_accepted(models, reference):
    target, _ = models
    config = {"model": target, "num_speculative_tokens": 4}  # the method vLLM infers: draft_model
    llm = LLM(target, speculative_config=config, **ENGINE_ARGS)
    try:
        outputs = llm.generate(_PROMPTS, _GREEDY, use_tqdm=False)
        stats = llm.llm_engine.engine_core.engine_core.scheduler.spec_decoding_stats
    finally:
        llm.shutdown()
    assert _token_ids([outputs]) == _token_ids(reference[:1])
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens
