"""Gemma 3's tiny config through the real engine: its sliding-window and global layers form two
KV cache groups (the hybrid coordinator), prompts are chunked over steps, and the greedy tokens
match transformers. A prompt seen before is served from the prefix cache in both groups
with the same tokens, and every block is back in the pool afterwards. Split over 2 devices,
the engine gives the same tokens. One engine runs at a time: each fixture shuts its own down.
"""

import dataclasses

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


@dataclasses.dataclass
class Run:
    family: Family
    path: str
    kv_cache_groups: tuple
    outputs: list
    again: object
    num_free_blocks: int


def _scheduler(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _generate(llm: LLM, prompts) -> list:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """The three prompts, then the longest again, on one device."""
    path = tmp_path_factory.mktemp("gemma3-engine")
    family = Family("gemma3", path)
    make_tokenizer().save_pretrained(path)
    llm = LLM(str(path), **ENGINE_ARGS)
    try:
        outputs = _generate(llm, PROMPTS)
        (again,) = _generate(llm, PROMPTS[2:])
        scheduler = _scheduler(llm)
        groups = scheduler.kv_cache_config.kv_cache_groups
        num_free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    finally:
        llm.shutdown()
    return Run(family, str(path), groups, outputs, again, num_free)


def _hf_greedy(family: Family, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    ids, tokens, rows = list(prompt), [], []
    for _ in range(NUM_TOKENS):
        rows.append(family.hf_logits(ids)[-1])
        tokens.append(int(rows[-1].argmax()))
        ids.append(tokens[-1])
    return tokens, rows


def test_sliding_and_global_layers_form_two_groups(run):
    groups = run.kv_cache_groups
    assert [type(g.kv_cache_spec) for g in groups] == [SlidingWindowSpec, FullAttentionSpec]
    assert groups[0].kv_cache_spec.sliding_window == WINDOW
    assert groups[0].layer_names == ("model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.3.self_attn")
    assert groups[1].layer_names == ("model.layers.2.self_attn",)


def test_greedy_tokens_match_transformers(run):
    for prompt, output in zip(PROMPTS, run.outputs, strict=True):
        ours = list(output.outputs[0].token_ids)
        theirs, their_rows = _hf_greedy(run.family, prompt)
        if ours != theirs:
            i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            our_top2 = output.outputs[0].logprobs[i]
            assert set(our_top2) == {ours[i], theirs[i]}, (len(prompt), i, ours, theirs)
            assert abs(our_top2[ours[i]].logprob - our_top2[theirs[i]].logprob) < 1e-3
            assert abs(their_rows[i][ours[i]] - their_rows[i][theirs[i]]) < 1e-3


def test_a_repeated_prompt_hits_the_prefix_cache_and_no_block_leaks(run):
    assert run.again.num_cached_tokens == (len(PROMPTS[2]) // 16) * 16
    assert run.again.outputs[0].token_ids == run.outputs[2].outputs[0].token_ids
    assert run.num_free_blocks == ENGINE_ARGS["num_gpu_blocks_override"] - 1


def test_two_devices_give_the_same_tokens(run):
    llm = LLM(run.path, tensor_parallel_size=2, **ENGINE_ARGS)
    try:
        outputs = _generate(llm, PROMPTS)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in run.outputs]
