"""DeepSeek-V3 (tiny, random weights) through the engine: the latent KV cache is sized and
allocated from MLA specs, greedy tokens equal transformers' `generate`, a repeated prompt
hits the prefix cache with the same tokens, and one token's cache is (kv_lora_rank +
qk_rope_head_dim) x dtype bytes x layers, against 2 x kv_heads x head_dim x ... for GQA."""

import numpy as np
import pytest
import torch

from tests.helpers.families import Family
from tests.helpers.tokenizer import make_tokenizer
from vjx import LLM, SamplingParams

_PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(2, 296, 40 + 30 * i)] for i in range(3)]
_NUM_TOKENS = 24


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Family:
    family = Family("deepseek_v3", tmp_path_factory.mktemp("deepseek_v3"))
    make_tokenizer().save_pretrained(family.model_config.model)
    return family


@pytest.fixture(scope="module")
def llm(family):
    model_dir = family.model_config.model
    engine = LLM(model_dir, dtype="float32", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64, seed=0)
    yield engine
    engine.shutdown()


def test_greedy_tokens_equal_transformers_generate(family, llm):
    params = SamplingParams(max_tokens=_NUM_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in _PROMPTS], params, use_tqdm=False)
    for prompt, output in zip(_PROMPTS, outputs):
        with torch.no_grad():
            expected = family.hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=_NUM_TOKENS, do_sample=False, min_new_tokens=_NUM_TOKENS
            )[0, len(prompt) :].tolist()
        assert list(output.outputs[0].token_ids) == expected


def test_a_repeated_prompt_hits_the_prefix_cache(llm):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = {"prompt_token_ids": _PROMPTS[2]}
    first = llm.generate(prompt, params, use_tqdm=False)[0]
    second = llm.generate(prompt, params, use_tqdm=False)[0]
    assert second.num_cached_tokens >= 64
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_token_caches_one_latent_per_layer(family, llm):
    worker = llm.llm_engine.engine_core.engine_core.model_executor.worker
    text = family.hf_config
    block_size = worker.kv_cache_config.block_size
    per_token = worker.get_kv_block_bytes() // block_size
    assert per_token == (text.kv_lora_rank + text.qk_rope_head_dim) * 4 * text.num_hidden_layers
    # Expanded per head (what the latent stands for): 4.8x more here, 71x at V3's real sizes.
    keys_and_values = text.num_attention_heads * (text.qk_nope_head_dim + text.qk_rope_head_dim + text.v_head_dim)
    assert keys_and_values * 4 * text.num_hidden_layers / per_token == pytest.approx(4.8)
