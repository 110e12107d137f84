"""Bamba's tiny config (Mamba2, attention, Mamba2) through the real engine: its layers form a
state-slot group and a full-attention group under the hybrid allocator; prompts longer than
the 64-token budget arrive in chunks (each boundary inside the conv window of the next
token) beside other requests' decodes.

- 16 prompts batched give the tokens each gives alone, and transformers' `generate`'s.
- A pool too small for every request at once preempts some (their state slots are freed and
  they are recomputed from scratch): the tokens are the same, every block comes back, and a
  repeated prompt is never a prefix-cache hit (a state covers the whole prefix).
- Speculative decoding is refused (a rejected draft would stay in the state).
One engine runs at a time: each fixture shuts its own down.
"""

import numpy as np
import pytest
import torch

from tests.helpers.families import VOCAB, Family
from tests.helpers.tokenizer import make_tokenizer
from vjx import LLM, SamplingParams
from vjx.kv_cache_interface import FullAttentionSpec, MambaSpec

NUM_TOKENS = 32
PROMPTS = [np.random.default_rng(n).integers(2, VOCAB, 5 + 7 * n).tolist() for n in range(16)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
ENGINE_ARGS = dict(
    block_size=16, max_model_len=256, max_num_batched_tokens=64, multiprocess=False, async_scheduling=False
)


def _generate(llm: LLM, prompts) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def _scheduler(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.scheduler


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Family:
    family = Family("bamba", tmp_path_factory.mktemp("bamba"))
    make_tokenizer().save_pretrained(family.model_config.model)
    return family


@pytest.fixture(scope="module")
def roomy(family) -> dict:
    """The 16 prompts batched, then each alone, with blocks for all of them."""
    llm = LLM(family.model_config.model, max_num_seqs=16, num_gpu_blocks_override=200, **ENGINE_ARGS)
    try:
        groups = llm.llm_engine.engine_core.engine_core.model_executor.worker.kv_cache_config.kv_cache_groups
        return {
            "specs": [type(group.kv_cache_spec) for group in groups],
            "batched": _generate(llm, PROMPTS),
            "alone": [_generate(llm, [prompt])[0] for prompt in PROMPTS],
            "preemptions": _scheduler(llm).num_preemptions,
        }
    finally:
        llm.shutdown()


def test_layers_form_a_state_group_and_an_attention_group(roomy):
    assert sorted(spec.__name__ for spec in roomy["specs"]) == ["FullAttentionSpec", "MambaSpec"]
    assert {MambaSpec, FullAttentionSpec} == set(roomy["specs"])


def test_batch_of_16_equals_each_alone(roomy):
    assert roomy["preemptions"] == 0
    assert roomy["batched"] == roomy["alone"]
    assert len({tuple(tokens) for tokens in roomy["batched"]}) == len(PROMPTS)


@pytest.mark.parametrize("index", [0, 9, 15])
def test_greedy_tokens_equal_transformers_generate(family, roomy, index):
    prompt = PROMPTS[index]
    with torch.no_grad():
        expected = family.hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=NUM_TOKENS, do_sample=False, min_new_tokens=NUM_TOKENS
        )[0, len(prompt) :].tolist()
    assert roomy["batched"][index] == expected


@pytest.fixture(scope="module")
def tight(family) -> dict:
    """The 8 longest prompts with blocks for about half of them at once, then one again."""
    llm = LLM(family.model_config.model, max_num_seqs=8, num_gpu_blocks_override=40, **ENGINE_ARGS)
    try:
        outputs = _generate(llm, PROMPTS[8:])
        scheduler = _scheduler(llm)
        again = llm.generate({"prompt_token_ids": PROMPTS[15]}, GREEDY, use_tqdm=False)[0]
        return {
            "outputs": outputs,
            "preemptions": scheduler.num_preemptions,
            "again": again,
            "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        }
    finally:
        llm.shutdown()


def test_preempted_requests_resume_with_the_same_tokens(roomy, tight):
    assert tight["preemptions"] > 0
    assert tight["outputs"] == roomy["batched"][8:]
    assert tight["free_blocks"] == 39  # every block but the null one is back


def test_a_repeated_prompt_is_not_a_prefix_hit(roomy, tight):
    assert tight["again"].num_cached_tokens == 0
    assert list(tight["again"].outputs[0].token_ids) == roomy["batched"][15]


def test_speculative_decoding_is_refused(family):
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    with pytest.raises(ValueError, match=r"speculative_config with a model of state-space \(Mamba\) layers"):
        LLM(family.model_config.model, max_num_seqs=4, speculative_config=ngram, **ENGINE_ARGS)
