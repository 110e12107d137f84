"""End-to-end engine invariants on the default model (SmolLM2-135M-Instruct), greedy.

Two engines are shared by the whole module (XLA compile time dominates on CI's 2 cores):
- `small`: a 32-token budget (every longer prompt is chunked) and a KV pool too small for 16
  requests at once, so the 16-prompt batch gets preempted;
- `large`: no chunked prefill, a pool that fits everything.
Every configuration must produce the same greedy tokens.
"""

import numpy as np
import pytest
import torch
import transformers

from tests.helpers.large_engine import LARGE_ARGS, PROMPTS
from tests.helpers.model_steps import empty_caches, prefill, random_blocks
from vjx import LLM, SamplingParams
from vjx.worker import model_runner
from vjx.worker.step_layout import GENERAL, PLAIN

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def small_llm():
    # 16 requests of up to ~60 tokens need ~64 blocks of 16; 24 blocks force preemption.
    return LLM(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=32, num_gpu_blocks_override=24)


@pytest.fixture(scope="module")
def large_llm():
    # Both step variants, as an accelerator compiles them (the CPU compiles GENERAL alone).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_runner, "step_variants", lambda platform: (PLAIN, GENERAL))
        return LLM(**LARGE_ARGS, async_scheduling=False)


@pytest.fixture(scope="module")
def reference_tokens(large_llm):
    outputs = large_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def _tokens(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_large_engine_outputs_are_full_length(reference_tokens):
    assert [len(t) for t in reference_tokens] == [MAX_TOKENS] * len(PROMPTS)


def _hf_greedy(hf_model, prompt_ids, num_tokens):
    """Greedy tokens and, per step, the top-5 token ids (float32, one token a forward on the
    KV cache)."""
    tokens, top5 = [], []
    with torch.no_grad():
        out = hf_model(torch.as_tensor([prompt_ids]), use_cache=True)
        for _ in range(num_tokens):
            logits = out.logits[0, -1]
            top5.append(torch.topk(logits, 5).indices.tolist())
            tokens.append(int(logits.argmax()))
            out = hf_model(torch.as_tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, top5


def test_greedy_matches_transformers(large_llm, reference_tokens):
    """Identical, or at the first difference each side's token is in the other's top-5."""
    config = large_llm.llm_engine.config.model_config
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32).eval()
    tokenizer = large_llm.get_tokenizer()
    for prompt, ours in zip(PROMPTS[:4], reference_tokens[:4]):
        prompt_ids = tokenizer.encode(prompt)
        theirs, their_top5 = _hf_greedy(hf_model, prompt_ids, MAX_TOKENS)
        if ours == theirs:
            continue
        i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        model = large_llm.llm_engine.engine_core.engine_core.model_executor.worker.model
        logits, _ = prefill(model, prompt_ids + ours[:i], 0, random_blocks(0), empty_caches(config.hf_config))
        our_top5 = np.argsort(logits[-1])[::-1][:5].tolist()
        assert ours[i] in their_top5[i] and theirs[i] in our_top5, (prompt, i, ours, theirs)


def test_batch_size_one_equals_batch_of_sixteen(large_llm, reference_tokens):
    one_by_one = [_tokens(large_llm, [prompt])[0] for prompt in PROMPTS[:4]]
    assert one_by_one == reference_tokens[:4]


def test_chunked_prefill_equals_unchunked(small_llm, reference_tokens):
    long_prompts = [p for p in PROMPTS if len(small_llm.get_tokenizer().encode(p)) > 32]
    assert long_prompts, "the prompt set must hold prompts longer than the 32-token budget"
    indices = [PROMPTS.index(p) for p in long_prompts]
    assert _tokens(small_llm, long_prompts) == [reference_tokens[i] for i in indices]


def test_preempted_batch_equals_roomy_batch(small_llm, reference_tokens):
    scheduler = small_llm.llm_engine.engine_core.engine_core.scheduler
    preemptions_before = scheduler.num_preemptions
    assert _tokens(small_llm, PROMPTS) == reference_tokens
    assert scheduler.num_preemptions > preemptions_before
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 24 - 1


def test_no_compilation_after_warm_up(large_llm):
    runner = large_llm.llm_engine.engine_core.engine_core.model_executor.worker.model_runner
    large_llm.generate(PROMPTS[:3], GREEDY, use_tqdm=False)
    assert runner.compile_watch.num_compiles == 0


def test_outputs_keep_input_order_and_mixed_params(large_llm, reference_tokens):
    params = [GREEDY, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)]
    outputs = large_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert [o.prompt for o in outputs] == PROMPTS[:2]
    assert outputs[0].outputs[0].token_ids == reference_tokens[0]
    assert outputs[1].outputs[0].token_ids == reference_tokens[1][:5]
    assert outputs[1].outputs[0].finish_reason == "length"


def test_token_id_prompt_equals_text_prompt(large_llm, reference_tokens):
    ids = large_llm.get_tokenizer().encode(PROMPTS[0])
    output = large_llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert output.prompt_token_ids == ids
    assert output.outputs[0].token_ids == reference_tokens[0]


def test_seeded_sampling_is_reproducible_across_batches(large_llm):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=7, max_tokens=12, ignore_eos=True)
    alone = large_llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs[0].token_ids
    batched = large_llm.generate(PROMPTS[:6], params, use_tqdm=False)[1].outputs[0].token_ids
    assert alone == batched


def test_chat_applies_the_template(large_llm):
    output = large_llm.chat([{"role": "user", "content": "Say hello."}], GREEDY, use_tqdm=False)[0]
    text = large_llm.get_tokenizer().decode(output.prompt_token_ids)
    assert "<|im_start|>user\nSay hello.<|im_end|>" in text
    assert text.rstrip().endswith("<|im_start|>assistant")
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -5}, "top_k"),
    ],
)
def test_bad_sampling_params_raise(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SamplingParams(**kwargs)


def test_prompt_longer_than_max_model_len_raises_and_leaks_nothing(large_llm):
    scheduler = large_llm.llm_engine.engine_core.engine_core.scheduler
    free_before = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    with pytest.raises(ValueError, match="max_model_len"):
        large_llm.generate([PROMPTS[0], {"prompt_token_ids": [1] * 300}], GREEDY, use_tqdm=False)
    assert not large_llm.llm_engine.has_unfinished_requests()
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free_before


def test_mismatched_params_list_raises(large_llm):
    with pytest.raises(ValueError, match="sampling_params"):
        large_llm.generate(PROMPTS[:3], [GREEDY, GREEDY], use_tqdm=False)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_model_len": 100_000}, "max_model_len"),
        ({"block_size": 7}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"load_format": "pickle"}, "load_format"),
        ({"dtype": "int8"}, "dtype"),
        ({"max_num_batched_tokens": 8, "max_num_seqs": 16}, "max_num_batched_tokens"),
    ],
)
def test_bad_engine_args_raise(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        LLM(**kwargs)


def test_stats_are_logged_when_enabled(large_llm, caplog, monkeypatch):
    engine = large_llm.llm_engine
    monkeypatch.setattr(engine, "log_stats", True)
    monkeypatch.setattr(engine, "stat_logger", engine._make_stat_logger())
    monkeypatch.setattr(engine, "_last_stats_time", float("-inf"))
    with caplog.at_level("INFO", logger="vjx.engine.llm_engine"):
        large_llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    # One line at the first step, and one more per 5 s interval (a loaded machine may need one).
    lines = [r.getMessage() for r in caplog.records if r.name == "vjx.engine.llm_engine"]
    assert lines
    for line in lines:
        assert line.startswith("Running: ") and "KV cache usage: " in line and "Prefix cache hit rate: " in line


def test_plain_steps_leave_out_conditionals_and_draw_like_general_ones(large_llm, monkeypatch):
    runner = large_llm.llm_engine.engine_core.engine_core.model_executor.worker.model_runner
    assert all(
        "conditional" not in step.as_text() for (_, features), step in runner._compiled.items() if features == PLAIN
    )
    chosen = []
    features_of = runner._features
    monkeypatch.setattr(runner, "_features", lambda *args: chosen.append(features_of(*args)) or chosen[-1])
    sampled = SamplingParams(temperature=0.9, seed=5, max_tokens=10, ignore_eos=True)
    penalized = SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=10, ignore_eos=True)
    alone = large_llm.generate(PROMPTS[2], sampled, use_tqdm=False)[0].outputs[0].token_ids
    assert set(chosen) == {PLAIN}
    chosen.clear()
    beside = large_llm.generate(PROMPTS[2:4], [sampled, penalized], use_tqdm=False)[0].outputs[0].token_ids
    assert set(chosen) == {GENERAL}
    assert beside == alone
