"""Tensor parallelism on eight fake CPU devices: the same greedy tokens on 1, 2, 4 and 8.

Tiny random Llamas with 8 query heads and 8, 4, 2 or 1 KV heads run through the real engine
(loader, sharded step, attention under `shard_map`); with fewer KV heads than devices the
loader repeats them. The TP 1 engine is the reference. (Tied embeddings and attention biases
are covered by the data-parallel test's model.) The comparison is exact: float32
reductions split over devices could in principle flip a near tie, but these weights give
O(1) logits and every configuration agrees to the token.
"""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, save_tiny_llama
from vjx import LLM, SamplingParams

KV_HEADS = (8, 4, 2, 1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[int, str]:
    dirs = {}
    for num_kv_heads in KV_HEADS:
        path = tmp_path_factory.mktemp(f"llama-kv{num_kv_heads}")
        save_tiny_llama(path, num_kv_heads, seed=num_kv_heads)
        dirs[num_kv_heads] = str(path)
    return dirs


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_llms(model_dirs) -> dict[int, LLM]:
    return {kv: LLM(path, **ENGINE_ARGS) for kv, path in model_dirs.items()}


@pytest.fixture(scope="module")
def reference_tokens(reference_llms) -> dict[int, list[list[int]]]:
    return {kv: _greedy(llm) for kv, llm in reference_llms.items()}


@pytest.fixture(scope="module")
def tp4_kv2_llm(model_dirs) -> LLM:
    """Kept for the layout checks: 2 KV heads repeated over 4 devices."""
    return LLM(model_dirs[2], tensor_parallel_size=4, **ENGINE_ARGS)


def _worker(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.model_executor.worker


@pytest.mark.parametrize("tensor_parallel_size", [2, 4, 8])
@pytest.mark.parametrize("num_kv_heads", KV_HEADS)
def test_greedy_tokens_equal_one_device(model_dirs, reference_tokens, tp4_kv2_llm, num_kv_heads, tensor_parallel_size):
    if (num_kv_heads, tensor_parallel_size) == (2, 4):
        llm = tp4_kv2_llm
    else:
        llm = LLM(model_dirs[num_kv_heads], tensor_parallel_size=tensor_parallel_size, **ENGINE_ARGS)
    mesh = _worker(llm).mesh
    assert dict(mesh.shape) == {"data": 1, "model": tensor_parallel_size}
    tokens = _greedy(llm)
    assert tokens == reference_tokens[num_kv_heads]
    assert [len(t) for t in tokens] == [GREEDY.max_tokens] * len(PROMPTS)
    # Not all one token: the comparison would prove little on a degenerate model.
    assert len({t for row in tokens for t in row}) > 4


def _spec(array) -> P:
    return array.sharding.spec


def test_param_shardings_follow_the_rules_table(tp4_kv2_llm):
    model = _worker(tp4_kv2_llm).model
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    expected = {
        "qkv_proj": (attn.qkv_proj.kernel, P(None, "model", None, None)),
        "o_proj": (attn.o_proj.kernel, P("model", None, None)),
        "gate_up_proj": (mlp.gate_up_proj.kernel, P(None, None, "model")),
        "down_proj": (mlp.down_proj.kernel, P("model", None)),
        "embed_tokens": (model.model.embed_tokens.embedding, P("model", None)),
        "lm_head": (model.lm_head.kernel, P(None, "model")),
        "norm": (model.model.norm.weight, P(None)),
        "input_layernorm": (model.model.layers[1].input_layernorm.weight, P(None)),
    }
    for name, (param, spec) in expected.items():
        assert _spec(param[...]) == spec, name


def test_kv_heads_are_repeated_at_load_time(tp4_kv2_llm, model_dirs):
    """2 KV heads over 4 devices: each head is stored twice, one whole head per device, and
    each copy takes half of its group's query heads along in the fused q/k/v kernel."""
    import transformers

    hf_attn = transformers.LlamaForCausalLM.from_pretrained(model_dirs[2]).model.layers[1].self_attn
    q, k, v = (proj.weight.detach().numpy() for proj in (hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj))
    hidden, head_dim = k.shape[1], k.shape[0] // 2
    kernel = np.asarray(_worker(tp4_kv2_llm).model.model.layers[1].self_attn.qkv_proj.kernel[...])
    num_q = q.shape[0] // head_dim // 4
    assert kernel.shape == (hidden, 4, num_q + 2, head_dim)
    np.testing.assert_array_equal(kernel[:, :, :num_q].reshape(hidden, -1, head_dim), q.T.reshape(hidden, -1, head_dim))
    for part, weight in ((num_q, k), (num_q + 1, v)):
        expected = np.repeat(weight.T.reshape(hidden, 2, head_dim), 2, axis=1)
        np.testing.assert_array_equal(kernel[:, :, part], expected)
    shards = _worker(tp4_kv2_llm).model.model.layers[1].self_attn.qkv_proj.kernel[...].addressable_shards
    assert {shard.data.shape for shard in shards} == {(hidden, 1, num_q + 2, head_dim)}


def test_kv_cache_is_sharded_over_kv_heads(tp4_kv2_llm):
    worker = _worker(tp4_kv2_llm)
    caches = worker.model_runner.kv_caches
    assert len(caches) == 2
    for cache in caches:
        # The reference backend's layout [2, P, S, K, H], K = 4 after the repeat.
        assert cache.shape == (2, 32, 16, 4, 8)
        assert _spec(cache) == P(None, None, None, "model", None)
        assert {shard.data.shape for shard in cache.addressable_shards} == {(2, 32, 16, 1, 8)}
    assert {spec.num_kv_heads for spec in worker.kv_cache_specs.values()} == {4}
    # One device holds a quarter of each block.
    assert worker.get_kv_block_bytes() == 2 * 2 * 16 * 4 * 8 * 4 // 4


def test_sampling_features_under_tensor_parallelism(tp4_kv2_llm, reference_llms):
    """Seeded sampling, penalties, logit bias, bad words and (prompt) logprobs read the
    replicated history and slot tables and the gathered logits: TP 4 gives TP 1's results."""
    params = SamplingParams(
        temperature=0.8,
        seed=3,
        max_tokens=8,
        ignore_eos=True,
        logprobs=3,
        prompt_logprobs=2,
        presence_penalty=0.5,
        repetition_penalty=1.2,
        logit_bias={7: 2.0, 9: -5.0},
        bad_words=[" the"],
    )
    ours, theirs = (llm.generate(PROMPTS, params, use_tqdm=False) for llm in (tp4_kv2_llm, reference_llms[2]))
    for got, expected in zip(ours, theirs):
        assert got.outputs[0].token_ids == expected.outputs[0].token_ids
        for position_got, position_expected in zip(got.outputs[0].logprobs, expected.outputs[0].logprobs):
            assert position_got.keys() == position_expected.keys()
            for token, logprob in position_got.items():
                assert logprob.logprob == pytest.approx(position_expected[token].logprob, abs=1e-4)
        assert len(got.prompt_logprobs) == len(expected.prompt_logprobs)
