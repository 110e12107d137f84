"""Sampling features end to end on the default model: logprobs against transformers,
penalties, min_tokens and n > 1 sharing the prompt's blocks.

The engine uses the large engine's arguments (tests/helpers/large_engine.py), so the compile
cache hits.
"""

import numpy as np
import pytest
import torch
import transformers

from tests.helpers.large_engine import LARGE_ARGS
from vjx import LLM, SamplingParams

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm():
    return LLM(**LARGE_ARGS, async_scheduling=False)


@pytest.fixture(scope="module")
def hf_model(llm):
    path = llm.llm_engine.config.model_config.model
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _hf_logprobs(hf_model, token_ids):
    with torch.no_grad():
        logits = hf_model(torch.as_tensor([token_ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).numpy()


def test_logprobs_and_prompt_logprobs_match_transformers(llm, hf_model):
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, prompt_logprobs=2, ignore_eos=True)
    output = llm.generate(PROMPT, params, use_tqdm=False)[0]
    completion = output.outputs[0]
    ids = output.prompt_token_ids + completion.token_ids
    expected = _hf_logprobs(hf_model, ids)
    num_prompt = len(output.prompt_token_ids)
    assert len(completion.logprobs) == 6
    total = 0.0
    for i, (token, entries) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = expected[num_prompt - 1 + i]
        top3 = np.argsort(row)[::-1][:3].tolist()
        assert set(top3) <= set(entries) and token in entries
        for token_id, logprob in entries.items():
            assert abs(logprob.logprob - row[token_id]) < 1e-4
        assert entries[token].rank == 1  # greedy picks the most likely token
        total += entries[token].logprob
    assert completion.cumulative_logprob == pytest.approx(total, abs=1e-5)
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == num_prompt
    for p in range(1, num_prompt):
        entries = output.prompt_logprobs[p]
        token = output.prompt_token_ids[p]
        assert abs(entries[token].logprob - expected[p - 1][token]) < 1e-4
        assert entries[token].rank == int((expected[p - 1] >= expected[p - 1][token]).sum())


def test_repetition_penalty_changes_repetitive_greedy_output(llm):
    prompt = "1, 2, 1, 2, 1, 2, 1, 2,"
    plain = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0]
    penalized = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=2.0), use_tqdm=False
    )[0]
    assert plain.outputs[0].text.startswith(" 1, 2")
    assert penalized.outputs[0].token_ids != plain.outputs[0].token_ids


def test_min_tokens_holds_back_eos(llm):
    tokenizer = llm.get_tokenizer()
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    free = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)[0].outputs[0]
    assert free.finish_reason == "stop" and len(free.token_ids) < 30
    held = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=40, min_tokens=30), use_tqdm=False)[0]
    tokens = held.outputs[0].token_ids
    assert len(tokens) >= 30
    assert tokenizer.eos_token_id not in tokens[:30]


def test_n_samples_share_the_prompt_blocks(llm):
    prompt = "Once upon a time, in a land far away, there was a kingdom of " * 4
    params = SamplingParams(n=4, temperature=0.8, seed=5, max_tokens=8, ignore_eos=True)
    (output,) = llm.generate(prompt, params, use_tqdm=False)
    assert [c.index for c in output.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 8 for c in output.outputs)
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1
    full_blocks = (len(output.prompt_token_ids) - 1) // 16 * 16
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.kv_cache_manager.prefix_cache_stats.num_hit_tokens >= 3 * full_blocks


def test_logit_bias_allowed_tokens_and_bad_words(llm):
    tokenizer = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0]
    first = plain.token_ids[0]  # " Paris"
    forced = tokenizer.encode(" London", add_special_tokens=False)[0]
    biased = llm.generate(
        PROMPT,
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={forced: 100.0}),
        use_tqdm=False,
    )[0].outputs[0]
    assert biased.token_ids[0] == forced
    allowed = [first, forced]
    only = llm.generate(
        PROMPT,
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, allowed_token_ids=allowed),
        use_tqdm=False,
    )[0].outputs[0]
    assert set(only.token_ids) <= set(allowed)
    banned = llm.generate(
        PROMPT,
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, bad_words=["Paris"]),
        use_tqdm=False,
    )[0].outputs[0]
    assert first not in banned.token_ids
    banned_end = llm.generate(
        PROMPT,
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, bad_words=["Paris."]),
        use_tqdm=False,
    )[0].outputs[0]
    assert plain.token_ids[:2] == tokenizer.encode(" Paris.", add_special_tokens=False)
    assert banned_end.token_ids[0] == first and banned_end.token_ids[1] != plain.token_ids[1]
    # A slot that held a biased request holds a neutral row again for the next one.
    again = llm.generate([PROMPT] * 3, greedy, use_tqdm=False)
    assert all(o.outputs[0].token_ids == plain.token_ids for o in again)
