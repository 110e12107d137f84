"""Prefix caching end to end, greedy, on the tiny stand-in for the default model (its
tokenizer and vocabulary; caching is the engine's property, not the model's).

Two engines with the large engine's arguments (tests/helpers/large_engine.py: a 256-token
budget, no chunked prefill): prefix caching on (the default) for the module, and off for one
run. Caching must change which tokens are computed, never which tokens come out.
"""

import pytest

from tests.helpers.large_engine import LARGE_ARGS
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
STORY = (
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. Every morning the woodcutter walked into the forest "
    "with his axe, and every evening he came home tired but happy. "
)
QUESTIONS = [
    " Question: how many children did the woodcutter have? Answer:",
    " Question: where did the family live? Answer:",
    " Question: what did the woodcutter carry? Answer:",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))


@pytest.fixture(scope="module")
def cached_llm(model):
    llm = LLM(model=model, **LARGE_ARGS)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def prefix_ids(cached_llm):
    ids = cached_llm.get_tokenizer().encode(STORY * 4)
    assert len(ids) >= 200
    return ids[:200]


def _prompts(llm: LLM, prefix_ids: list[int], salt: str | None = None) -> list[dict]:
    tokenizer = llm.get_tokenizer()
    prompts = []
    for question in QUESTIONS:
        prompt = {"prompt_token_ids": prefix_ids + tokenizer.encode(question)}
        if salt is not None:
            prompt["cache_salt"] = salt
        prompts.append(prompt)
    return prompts


def _token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


def test_second_request_with_a_shared_prefix_hits_the_cache(cached_llm, prefix_ids):
    """The first request (about 210 tokens) fills the 256-token budget of its step; the
    others join the next step and find its full blocks in the cache."""
    cached_llm.llm_engine.engine_core.engine_core.scheduler.reset_prefix_cache()
    outputs = cached_llm.generate(_prompts(cached_llm, prefix_ids), GREEDY, use_tqdm=False)
    assert outputs[0].num_cached_tokens == 0
    # 200 shared tokens fill 12 blocks of 16.
    assert [o.num_cached_tokens >= 192 for o in outputs] == [False, True, True]
    assert all(o.num_cached_tokens % 16 == 0 for o in outputs)


def test_outputs_are_identical_with_prefix_caching_on_and_off(model, cached_llm, prefix_ids):
    cached = cached_llm.generate(_prompts(cached_llm, prefix_ids), GREEDY, use_tqdm=False)
    uncached_llm = LLM(model=model, **LARGE_ARGS, enable_prefix_caching=False)
    try:
        uncached = uncached_llm.generate(_prompts(uncached_llm, prefix_ids), GREEDY, use_tqdm=False)
    finally:
        uncached_llm.shutdown()
    assert all(output.num_cached_tokens >= 192 for output in cached[1:])
    assert all(output.num_cached_tokens == 0 for output in uncached)
    assert _token_ids(cached) == _token_ids(uncached)
    assert [len(token_ids) for token_ids in _token_ids(cached)] == [GREEDY.max_tokens] * 3


def test_cache_salt_isolates_prefixes(cached_llm, prefix_ids):
    """Tenant b's two requests run in the step after a's first: b's first misses (only a's
    and unsalted blocks are cached) and b's second hits the blocks b's first is filling in
    that same step (each layer writes the step's K/V before it attends)."""
    tenant_a = _prompts(cached_llm, prefix_ids, salt="tenant-a")[:2]
    tenant_b = _prompts(cached_llm, prefix_ids, salt="tenant-b")[:2]
    outputs = cached_llm.generate(tenant_a + tenant_b, GREEDY, use_tqdm=False)
    assert [o.num_cached_tokens >= 192 for o in outputs] == [False, True, False, True]
    assert outputs[0].num_cached_tokens == outputs[2].num_cached_tokens == 0
    assert _token_ids(outputs[:2]) == _token_ids(outputs[2:])
