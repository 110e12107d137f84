"""Gemma 3's tiny config through the real engine: its sliding-window and global layers form two
KV cache groups (the hybrid coordinator), prompts are chunked over steps, and the greedy tokens
match transformers. A prompt seen before is served from the prefix cache in both groups
with the same tokens, and every block is back in the pool afterwards.
"""

import numpy as np
import pytest

from tests.helpers.families import VOCAB, WINDOW, Family
from tests.helpers.tokenizer import make_tokenizer
from vjx import LLM, SamplingParams
from vjx.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

NUM_TOKENS = 32
PROMPTS = [np.random.default_rng(n).integers(2, VOCAB, n).tolist() for n in (11, 100, 300)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=2)
ENGINE_ARGS = dict(
    block_size=16,
    max_model_len=512,
    max_num_seqs=4,
    max_num_batched_tokens=64,
    num_gpu_blocks_override=96,
    multiprocess=False,
    async_scheduling=False,
)
"""A 64-token budget: the 100- and 300-token prompts run in chunks beside the others' decodes."""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3-engine")
    family = Family("gemma3", path)
    make_tokenizer().save_pretrained(path)
    llm = LLM(str(path), **ENGINE_ARGS)
    yield family, llm
    llm.shutdown()


def _scheduler(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _hf_greedy(family: Family, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    ids, tokens, rows = list(prompt), [], []
    for _ in range(NUM_TOKENS):
        rows.append(family.hf_logits(ids)[-1])
        tokens.append(int(rows[-1].argmax()))
        ids.append(tokens[-1])
    return tokens, rows


def test_sliding_and_global_layers_form_two_groups(engine):
    _, llm = engine
    groups = _scheduler(llm).kv_cache_config.kv_cache_groups
    assert [type(g.kv_cache_spec) for g in groups] == [SlidingWindowSpec, FullAttentionSpec]
    assert groups[0].kv_cache_spec.sliding_window == WINDOW
    assert groups[0].layer_names == ("model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.3.self_attn")
    assert groups[1].layer_names == ("model.layers.2.self_attn",)


def test_greedy_tokens_match_transformers_and_the_prefix_cache(engine):
    family, llm = engine
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        ours = list(output.outputs[0].token_ids)
        theirs, their_rows = _hf_greedy(family, prompt)
        if ours != theirs:
            i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            our_top2 = output.outputs[0].logprobs[i]
            assert set(our_top2) == {ours[i], theirs[i]}, (len(prompt), i, ours, theirs)
            assert abs(our_top2[ours[i]].logprob - our_top2[theirs[i]].logprob) < 1e-3
            assert abs(their_rows[i][ours[i]] - their_rows[i][theirs[i]]) < 1e-3
    (again,) = llm.generate([{"prompt_token_ids": PROMPTS[2]}], GREEDY, use_tqdm=False)
    assert again.num_cached_tokens == (len(PROMPTS[2]) // 16) * 16
    assert again.outputs[0].token_ids == outputs[2].outputs[0].token_ids
    pool = _scheduler(llm).kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == ENGINE_ARGS["num_gpu_blocks_override"] - 1
