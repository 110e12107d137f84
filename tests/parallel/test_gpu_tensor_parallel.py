"""Tensor parallelism on real GPUs (run with `pytest -m gpu tests/parallel` on a 2-GPU device).

A tiny random Llama (head dim 64, 8 query heads, 2 KV heads) through the Pallas GPU backend:
TP 2 (the kernel under `shard_map`, one KV head per GPU) must give the greedy tokens of
TP 1. Both engines run in float32 with O(1) logits, so no near tie can flip a token.
"""

import jax
import pytest

from tests.helpers.tiny_llama import PROMPTS, save_tiny_llama
from vjx import LLM, SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE_ARGS = dict(
    dtype="float32",
    attention_backend="pallas_gpu",
    max_model_len=64,
    max_num_seqs=4,
    max_num_batched_tokens=32,
    num_gpu_blocks_override=64,
    multiprocess=False,
    gpu_memory_utilization=0.3,
)


def test_tp2_greedy_tokens_equal_tp1(tmp_path):
    if len(jax.devices()) < 2:
        pytest.skip(f"needs 2 GPUs, found {len(jax.devices())}")
    save_tiny_llama(tmp_path, 2, hidden_size=512, head_dim=64)
    results = {}
    for size in (1, 2):
        llm = LLM(str(tmp_path), tensor_parallel_size=size, **ENGINE_ARGS)
        results[size] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        llm.shutdown()
    assert results[2] == results[1]
    assert len({t for row in results[1] for t in row}) > 4
