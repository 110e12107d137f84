"""DeepSeek-V2/V3's MoE block against transformers': the grouped top-k routing against the HF
routers, and the whole block (routed + shared experts) loaded from a saved tiny checkpoint
through the loader, on one device and split over several (tensor and expert parallelism)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from tests.helpers.tiny_llama import randomize_
from vjx.attention.reference import ReferenceBackend
from vjx.config import ParallelConfig
from vjx.models.layers.decoder import BuildContext, DecoderArgs
from vjx.models.layers.deepseek_moe import GroupedTopK, deepseek_moe_block, grouped_topk, is_moe_layer
from vjx.models.loader import _CheckpointNames, _fill_from_safetensors, _param_slots, _Placement
from vjx.sharding.mesh import make_mesh

NUM_TOKENS = 64
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=0,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
)
CONFIGS = {
    "v3": lambda: transformers.DeepseekV3Config(**TINY, routed_scaling_factor=2.5, norm_topk_prob=True),
    "v2_greedy": lambda: transformers.DeepseekV2Config(**TINY, routed_scaling_factor=1.5, topk_method="greedy"),
    # A group ranks by its best expert, so only fewer groups than experts per token bite.
    "v2_group_limited": lambda: transformers.DeepseekV2Config(
        **{**TINY, "topk_group": 1}, routed_scaling_factor=1.5, topk_method="group_limited_greedy"
    ),
}


def _hf_router(name: str):
    config = CONFIGS[name]()
    router = (DeepseekV3TopkRouter if name == "v3" else DeepseekV2TopkRouter)(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
        if name == "v3":
            router.e_score_correction_bias.copy_(0.2 * torch.randn(8, generator=gen))
    return config, router


def _sorted_by_id(weights, ids):
    order = np.argsort(ids, axis=-1)
    return np.take_along_axis(np.asarray(weights), order, -1), np.take_along_axis(np.asarray(ids), order, -1)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_grouped_topk_equals_transformers_router(name):
    config, router = _hf_router(name)
    x = torch.randn(NUM_TOKENS, TINY["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    routing = GroupedTopK.from_hf_config(config)
    bias = jnp.asarray(router.e_score_correction_bias.numpy()) if name == "v3" else None
    weights, ids = grouped_topk(jnp.asarray(logits.numpy()), routing, bias)
    assert weights.dtype == jnp.float32 and ids.dtype == jnp.int32
    expected_weights, expected_ids = _sorted_by_id(hf_weights.numpy(), hf_ids.numpy())
    weights, ids = _sorted_by_id(weights, ids)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(weights, expected_weights, rtol=0, atol=1e-6)
    # The rule under test matters: the groups (and V3's bias) change some tokens' experts.
    ungrouped = GroupedTopK(8, 2, 1, 1, routing.scoring_func, routing.renormalize, routing.routed_scaling_factor)
    _, plain_ids = _sorted_by_id(*grouped_topk(jnp.asarray(logits.numpy()), ungrouped))
    assert (name == "v2_greedy") == bool((plain_ids == ids).all())


def test_routing_reads_the_config():
    v3, v2 = CONFIGS["v3"](), CONFIGS["v2_greedy"]()
    assert GroupedTopK.from_hf_config(v3) == GroupedTopK(8, 2, 4, 2, "sigmoid", True, 2.5)
    assert GroupedTopK.from_hf_config(v2) == GroupedTopK(8, 2, 1, 1, "softmax", False, 1.5)
    with pytest.raises(ValueError, match="n_group must divide the 8 experts, got 3"):
        GroupedTopK(8, 2, 3, 1, "softmax", False)
    with pytest.raises(ValueError, match="n_group must leave 2 or more"):
        GroupedTopK(8, 2, 8, 2, "sigmoid", True)
    with pytest.raises(ValueError, match="topk_group must be in \\[1, 4\\], got 5"):
        GroupedTopK(8, 2, 4, 5, "sigmoid", True)
    with pytest.raises(ValueError, match="num_experts_per_tok must be in \\[1, 4\\]"):
        GroupedTopK(8, 5, 4, 2, "sigmoid", True)


def test_moe_layers():
    config = CONFIGS["v2_greedy"]()
    config.first_k_dense_replace, config.moe_layer_freq = 1, 2
    assert [is_moe_layer(config, i) for i in range(5)] == [False, False, True, False, True]


def _hf_moe(name: str, model_dir: pathlib.Path):
    """The HF model's MoE block, its model saved to `model_dir`."""
    config = CONFIGS[name]()
    model_cls = transformers.DeepseekV3ForCausalLM if name == "v3" else transformers.DeepseekV2ForCausalLM
    torch.manual_seed(0)
    hf_model = model_cls(config).eval()
    randomize_(hf_model, 0)
    mlp = hf_model.model.layers[0].mlp
    if name == "v3":
        with torch.no_grad():
            mlp.gate.e_score_correction_bias.copy_(0.2 * torch.randn(8, generator=torch.Generator().manual_seed(2)))
    hf_model.save_pretrained(model_dir)
    return config, mlp


def _load_block(config, model_dir: pathlib.Path, mesh=None, expert_parallel: bool = False):
    """vjx's block, filled from the checkpoint's `model.layers.0.mlp` tensors by the loader."""
    args = DecoderArgs.from_hf_config(config)
    ctx = BuildContext(config, args, jnp.dtype(jnp.float32), ReferenceBackend(), nnx.Rngs(0), None, expert_parallel)
    block = deepseek_moe_block(ctx)
    names = _CheckpointNames({"model.layers.0.mlp.": "", "": None}, {}, is_tied=False)
    _fill_from_safetensors(_param_slots(block), model_dir, names, _Placement(mesh))
    return block


@nnx.jit
def _run(block, x):
    return block(x)


@pytest.mark.parametrize("num_tokens", [3, 24], ids=["gathered", "grouped"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_block_equals_transformers(tmp_path, name, num_tokens):
    config, hf_mlp = _hf_moe(name, tmp_path)
    block = _load_block(config, tmp_path)
    assert block.gate.weight[...].dtype == jnp.float32
    assert (block.gate.e_score_correction_bias is not None) == (name == "v3")
    x = torch.randn(1, num_tokens, TINY["hidden_size"], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf_mlp(x)[0].numpy()
    np.testing.assert_allclose(_run(block, jnp.asarray(x[0].numpy())), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("devices", "expert_parallel"), [(4, True), (2, False)])
def test_split_block_equals_one_device(tmp_path, devices, expert_parallel):
    config, _ = _hf_moe("v3", tmp_path)
    x = jax.random.normal(jax.random.key(4), (24, TINY["hidden_size"]))
    expected = _run(_load_block(config, tmp_path), x)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=devices, enable_expert_parallel=expert_parallel))
    block = _load_block(config, tmp_path, mesh, expert_parallel)
    assert block.experts.w13[...].sharding.spec[0 if expert_parallel else 3] == "model"
    with jax.set_mesh(mesh):
        out = _run(block, x)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)
