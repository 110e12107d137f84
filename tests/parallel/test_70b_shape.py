"""Llama-3.1-70B's head layout (64 query heads, 8 KV heads, MLP 3.5x the width, llama3 RoPE
scaling) at a CPU-sized width: TP 4 and TP 8 give TP 1's greedy tokens.

The 70B runs themselves need 4- and 8-GPU machines (`benchmarks/h200_70b.sh`); this keeps
the layouts they use (8 and 16 query heads per device, 1 and 2 KV heads) tested on CPU.
"""

import pytest

from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, save_tiny_llama
from vjx import LLM, SamplingParams

SHAPE_70B = dict(
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=8,
    hidden_size=512,
    intermediate_size=1792,
    rope_theta=500000.0,
    rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    ),
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("llama-70b-shape")
    save_tiny_llama(path, SHAPE_70B["num_key_value_heads"], seed=70, **SHAPE_70B)
    return str(path)


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_tp4_and_tp8_equal_one_device(model_dir):
    reference = _greedy(LLM(model_dir, **ENGINE_ARGS))
    for tensor_parallel_size in (4, 8):
        assert _greedy(LLM(model_dir, tensor_parallel_size=tensor_parallel_size, **ENGINE_ARGS)) == reference
