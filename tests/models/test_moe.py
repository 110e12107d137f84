"""The fused MoE layer: routing rules, the grouped GEMMs against a loop over experts, and
expert parallelism (whole experts per device) against one device.

The families' logits, greedy tokens, chunked prefill and tensor parallelism against
transformers are in test_family_parity.py (mixtral, qwen2_moe, qwen3_moe).
"""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from tests.helpers.families import COMMON, Family, float32_model_config
from tests.helpers.model_steps import BLOCK_SIZE, NUM_BLOCKS, prefill, random_blocks
from tests.helpers.tiny_llama import randomize_
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.models.layers.activation import GATED_ACTIVATIONS
from vjx.models.layers.fused_moe import fused_experts, select_experts
from vjx.models.loader import get_model
from vjx.models.registry import verify_tensor_parallel
from vjx.sharding.mesh import make_mesh
from vjx.sharding.placement import num_cache_kv_heads
from vjx.sharding.rules import logical_sharding

NUM_EXPERTS = 8


def test_router_ties_go_to_the_lower_expert():
    logits = jnp.asarray([[1.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    weights, ids = select_experts(logits, 2, renormalize=False)
    np.testing.assert_array_equal(ids, [[1, 2], [0, 1]])
    np.testing.assert_allclose(weights[1], [0.25, 0.25], rtol=1e-6)


@pytest.mark.parametrize("renormalize", [False, True])
def test_router_weights(renormalize):
    logits = jax.random.normal(jax.random.key(0), (16, NUM_EXPERTS)) * 3
    weights, ids = select_experts(logits, 3, renormalize=renormalize)
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    expected_ids = np.argsort(-probs, axis=-1, kind="stable")[:, :3]
    np.testing.assert_array_equal(ids, expected_ids)
    expected = np.take_along_axis(probs, expected_ids, axis=-1)
    if renormalize:
        # gpt-oss's rule, the softmax over the top-k logits alone, is the same weights.
        top_logits = np.take_along_axis(np.asarray(logits), expected_ids, axis=-1)
        np.testing.assert_allclose(expected / expected.sum(-1, keepdims=True), jax.nn.softmax(top_logits), rtol=1e-6)
        expected = expected / expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    assert weights.dtype == jnp.float32


def _loop_over_experts(x, weights, ids, w13, w2, w13_bias, w2_bias, activation):
    """Each (token, expert) pair on its own, in float64."""
    x, w13, w2 = (np.asarray(a, np.float64) for a in (x, w13, w2))
    out = np.zeros_like(x)
    act = GATED_ACTIVATIONS[activation]
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate_up = np.einsum("d,dpf->pf", x[t], w13[e]) + np.asarray(w13_bias[e], np.float64)
            h = np.asarray(act(jnp.asarray(gate_up[0]), jnp.asarray(gate_up[1])), np.float64)
            out[t] += float(weights[t, k]) * (h @ w2[e] + np.asarray(w2_bias[e], np.float64))
    return out


@pytest.mark.parametrize("num_tokens", [3, 24], ids=["gathered", "grouped"])
@pytest.mark.parametrize("routing", ["random", "one_expert"])
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_fused_experts_equal_a_loop_over_experts(num_tokens, routing, activation):
    """Every token reaches each of its experts (no capacity limit), even all on one expert;
    3 tokens make 6 pairs, fewer than the 8 experts (each pair gathers its expert's weights),
    24 make 48 (one grouped GEMM)."""
    hidden, width, top_k = 32, 16, 2
    keys = jax.random.split(jax.random.key(1), 6)
    x = jax.random.normal(keys[0], (num_tokens, hidden))
    w13 = jax.random.normal(keys[1], (NUM_EXPERTS, hidden, 2, width)) / hidden**0.5
    w2 = jax.random.normal(keys[2], (NUM_EXPERTS, width, hidden)) / width**0.5
    w13_bias = jax.random.normal(keys[3], (NUM_EXPERTS, 2, width)) * 0.1
    w2_bias = jax.random.normal(keys[4], (NUM_EXPERTS, hidden)) * 0.1
    logits = jax.random.normal(keys[5], (num_tokens, NUM_EXPERTS))
    if routing == "one_expert":
        logits = logits.at[:, 5].set(100.0)
    weights, ids = select_experts(logits, top_k, renormalize=True)
    if routing == "one_expert":
        assert (ids[:, 0] == 5).all()
    out = fused_experts(x, weights, ids, w13, w2, w13_bias, activation=activation)
    out = out + jnp.einsum("TK,TKD->TD", weights, jnp.take(w2_bias, ids, axis=0))
    expected = _loop_over_experts(x, weights, ids, w13, w2, w13_bias, w2_bias, activation)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_tokens", [2, 10], ids=["gathered", "grouped"])
def test_experts_outside_the_slice_contribute_nothing(num_tokens):
    """A device holding experts 4..7 sums only the pairs routed to them."""
    hidden, width = 16, 8
    keys = jax.random.split(jax.random.key(2), 4)
    x = jax.random.normal(keys[0], (num_tokens, hidden))
    w13 = jax.random.normal(keys[1], (NUM_EXPERTS, hidden, 2, width))
    w2 = jax.random.normal(keys[2], (NUM_EXPERTS, width, hidden))
    weights, ids = select_experts(jax.random.normal(keys[3], (num_tokens, NUM_EXPERTS)), 2, renormalize=False)
    halves = [
        fused_experts(
            x, weights, ids, w13[first : first + 4], w2[first : first + 4], activation="silu", first_expert=first
        )
        for first in (0, 4)
    ]
    whole = fused_experts(x, weights, ids, w13, w2, activation="silu")
    np.testing.assert_allclose(halves[0] + halves[1], whole, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A Qwen3-MoE with 8 query heads and 8 experts, so that 8 devices each hold one."""
    config = transformers.Qwen3MoeConfig(
        **{**COMMON, "num_attention_heads": 8, "head_dim": 8},
        num_hidden_layers=2,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        architectures=["Qwen3MoeForCausalLM"],
    )
    torch.manual_seed(0)
    hf_model = transformers.Qwen3MoeForCausalLM(config).eval()
    randomize_(hf_model, 0)
    model_dir = tmp_path_factory.mktemp("qwen3_moe_ep")
    hf_model.save_pretrained(model_dir)
    return float32_model_config(model_dir)


def _caches(model_config, devices, mesh=None):
    text = model_config.hf_text_config
    shape = ReferenceBackend().kv_cache_shape(
        NUM_BLOCKS, BLOCK_SIZE, num_cache_kv_heads(text.num_key_value_heads, devices), text.head_dim
    )
    device = jax.devices()[0] if mesh is None else logical_sharding(mesh, ReferenceBackend().kv_cache_axes)
    return [jax.device_put(np.zeros(shape, np.float32), device) for _ in range(text.num_hidden_layers)]


def _greedy(model, model_config, prompt, devices=1, mesh=None, steps=8):
    blocks = random_blocks(7)
    logits, caches = prefill(model, prompt, 0, blocks, _caches(model_config, devices, mesh))
    first_logits, tokens = logits, [int(logits[-1].argmax())]
    for _ in range(steps - 1):
        logits, caches = prefill(model, [tokens[-1]], len(prompt) + len(tokens) - 1, blocks, caches)
        tokens.append(int(logits[-1].argmax()))
    return first_logits, tokens


@pytest.mark.parametrize(("devices", "expert_parallel"), [(2, True), (4, True), (8, True), (2, False)])
def test_expert_parallel_equals_one_device(moe_checkpoint, devices, expert_parallel):
    prompt = np.random.default_rng(8).integers(2, COMMON["vocab_size"], 40)
    expected_logits, expected_tokens = _greedy(get_model(moe_checkpoint, ReferenceBackend()), moe_checkpoint, prompt)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=devices, enable_expert_parallel=expert_parallel))
    model = get_model(
        moe_checkpoint, ShardedBackend(ReferenceBackend()), mesh=mesh, enable_expert_parallel=expert_parallel
    )
    w13 = model.model.layers[0].mlp.experts.w13[...]
    expert_dim, width_dim = w13.sharding.spec[0], w13.sharding.spec[3]
    assert (expert_dim, width_dim) == (("model", None) if expert_parallel else (None, "model"))
    with jax.set_mesh(mesh):
        logits, tokens = _greedy(model, moe_checkpoint, prompt, devices, mesh)
    np.testing.assert_allclose(logits, expected_logits, atol=1e-4, rtol=0)
    assert tokens == expected_tokens


def test_gpt_oss_expert_parallel_equals_one_device(tmp_path):
    """Biases on the experts and the router, and sinks split with the heads, over 4 devices
    that each hold one of the 4 experts."""
    family = Family("gpt_oss", tmp_path)
    prompt = np.random.default_rng(9).integers(2, COMMON["vocab_size"], 40)
    expected_logits, expected_tokens = _greedy(family.model, family.model_config, prompt)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4, enable_expert_parallel=True))
    model = get_model(family.model_config, ShardedBackend(ReferenceBackend()), mesh=mesh, enable_expert_parallel=True)
    assert model.model.layers[0].mlp.experts.w13_bias[...].sharding.spec[0] == "model"
    with jax.set_mesh(mesh):
        logits, tokens = _greedy(model, family.model_config, prompt, 4, mesh)
    np.testing.assert_allclose(logits, expected_logits, atol=1e-4, rtol=0)
    assert tokens == expected_tokens


@pytest.mark.parametrize(("field", "expert_parallel"), [("num_experts", True), ("moe_intermediate_size", False)])
def test_the_expert_split_is_checked(moe_checkpoint, field, expert_parallel):
    """4 devices split the heads but not 6 experts (EP) or a width of 30 (TP)."""
    config = copy.deepcopy(moe_checkpoint.hf_config)
    config.num_experts, config.moe_intermediate_size = 6, 30
    verify_tensor_parallel(config, 2, expert_parallel)
    with pytest.raises(ValueError, match=f"must divide the model's {field}"):
        verify_tensor_parallel(config, 4, expert_parallel)
