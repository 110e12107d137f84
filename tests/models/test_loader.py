"""The loader: dummy weights, dtypes, safetensors naming errors, placement, the registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import ReferenceBackend
from vjx.config import ModelConfig
from vjx.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vjx.models.layers.param import logical_axes_of
from vjx.models.loader import get_model
from vjx.sharding.rules import logical_to_mesh_axes

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 256, 64, 4, 2, 16, 128


def tiny_config(**overrides) -> transformers.LlamaConfig:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    config = transformers.LlamaConfig(**{**fields, **overrides})
    config.architectures = ["LlamaForCausalLM"]
    return config


def model_config(hf_config, model_dir="/nonexistent", **overrides) -> ModelConfig:
    fields = dict(
        model=str(model_dir),
        tokenizer=str(model_dir),
        hf_config=hf_config,
        dtype="float32",
        max_model_len=128,
        seed=0,
        load_format="dummy",
    )
    return ModelConfig(**{**fields, **overrides})


def save_hf(tmp_path, hf_config, torch_dtype=torch.float32):
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(hf_config).to(torch_dtype)
    hf_model.save_pretrained(tmp_path)
    return hf_model


def test_dummy_weights_have_real_shapes_and_are_not_zero():
    model = get_model(model_config(tiny_config()), ReferenceBackend())
    attn = model.model.layers[1].self_attn
    mlp = model.model.layers[1].mlp
    assert model.model.embed_tokens.embedding.shape == (VOCAB, HIDDEN)
    assert attn.qkv_proj.kernel.shape == (HIDDEN, KV_HEADS, HEADS // KV_HEADS + 2, HEAD_DIM)
    assert mlp.gate_up_proj.kernel.shape == (HIDDEN, 2, MLP)
    assert attn.o_proj.kernel.shape == (HEADS, HEAD_DIM, HIDDEN)
    assert mlp.down_proj.kernel.shape == (MLP, HIDDEN)
    assert model.lm_head.kernel.shape == (HIDDEN, VOCAB)
    for value in jax.tree.leaves(nnx.state(model, nnx.Param)):
        assert value.dtype == jnp.float32
        assert np.all(np.asarray(value) != 0.0)
    np.testing.assert_array_equal(model.model.norm.weight[...], np.ones(HIDDEN, np.float32))
    std = float(jnp.std(attn.qkv_proj.kernel[...]))
    assert 0.015 < std < 0.025


def test_dummy_weights_follow_the_seed():
    config = tiny_config()
    first = get_model(model_config(config, seed=3), ReferenceBackend())
    again = get_model(model_config(config, seed=3), ReferenceBackend())
    other = get_model(model_config(config, seed=4), ReferenceBackend())
    kernel = lambda m: np.asarray(m.model.layers[0].mlp.gate_up_proj.kernel[...])  # noqa: E731
    np.testing.assert_array_equal(kernel(first), kernel(again))
    assert not np.array_equal(kernel(first), kernel(other))


def test_tied_model_has_no_lm_head():
    model = get_model(model_config(tiny_config(tie_word_embeddings=True)), ReferenceBackend())
    assert model.lm_head is None


def test_unknown_architecture_is_a_value_error():
    config = tiny_config()
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        get_model(model_config(config), ReferenceBackend())


@pytest.mark.parametrize(("field", "value"), [("dtype", "float64"), ("load_format", "gguf-direct")])
def test_bad_model_config_is_a_value_error(field, value):
    with pytest.raises(ValueError, match=field):
        get_model(model_config(tiny_config(), **{field: value}), ReferenceBackend())


def test_bfloat16_load_casts_checkpoint_and_runs(tmp_path):
    hf_model = save_hf(tmp_path, tiny_config())
    config = model_config(hf_model.config, tmp_path, dtype="bfloat16", load_format="auto")
    model = get_model(config, ReferenceBackend())
    q_weight = hf_model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    kernel = model.model.layers[0].self_attn.qkv_proj.kernel[...]
    assert kernel.dtype == jnp.bfloat16
    expected = q_weight.T.reshape(HIDDEN, HEADS, HEAD_DIM).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(kernel[:, :, :-2]).reshape(expected.shape), expected)
    logits = run_one_token(model)
    assert logits.dtype == jnp.float32 and logits.shape == (1, VOCAB)
    assert np.isfinite(np.asarray(logits)).all()


def test_bfloat16_checkpoint_loads_exactly_as_float32(tmp_path):
    hf_model = save_hf(tmp_path, tiny_config(), torch_dtype=torch.bfloat16)
    model = get_model(model_config(hf_model.config, tmp_path, load_format="safetensors"), ReferenceBackend())
    expected = hf_model.model.embed_tokens.weight.detach().float().numpy()
    np.testing.assert_array_equal(np.asarray(model.model.embed_tokens.embedding[...]), expected)


def test_missing_tensor_is_named(tmp_path):
    save_hf(tmp_path, tiny_config())
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(path)
    del tensors["model.layers.1.mlp.gate_proj.weight"]
    safetensors.torch.save_file(tensors, path)
    config = model_config(tiny_config(), tmp_path, load_format="auto")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.gate_proj\.weight"):
        get_model(config, ReferenceBackend())


def test_unexpected_tensor_is_named(tmp_path):
    save_hf(tmp_path, tiny_config())
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(path)
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(HEAD_DIM)
    safetensors.torch.save_file(tensors, path)
    config = model_config(tiny_config(), tmp_path, load_format="auto")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_norm\.weight"):
        get_model(config, ReferenceBackend())


def test_mesh_places_params_by_logical_axes(tmp_path):
    save_hf(tmp_path, tiny_config())
    mesh = Mesh(np.asarray(jax.devices()[:1]), ("model",))
    config = model_config(tiny_config(), tmp_path, load_format="auto")
    model = get_model(config, ReferenceBackend(), mesh=mesh)
    qkv_proj = model.model.layers[0].self_attn.qkv_proj.kernel
    assert logical_axes_of(qkv_proj) == ("embed", "kv_heads", "qkv", "head_dim")
    assert qkv_proj[...].sharding == NamedSharding(mesh, PartitionSpec(None, "model", None, None))
    norm = model.model.norm.weight
    assert norm[...].sharding == NamedSharding(mesh, PartitionSpec(None))


def test_each_layer_declares_its_kv_cache_spec():
    model = get_model(model_config(tiny_config()), ReferenceBackend())
    full = FullAttentionSpec(16, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype="float32")
    assert model.get_kv_cache_spec(16, KV_HEADS, "float32") == {
        "model.layers.0.self_attn": full,
        "model.layers.1.self_attn": full,
    }
    wide = get_model(model_config(tiny_config(head_dim=32)), ReferenceBackend())
    assert {spec.head_size for spec in wide.get_kv_cache_spec(16, KV_HEADS, "float32").values()} == {32}
    windowed = get_model(model_config(tiny_config(sliding_window=32)), ReferenceBackend())
    window = SlidingWindowSpec(16, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype="float32", sliding_window=32)
    assert set(windowed.get_kv_cache_spec(16, KV_HEADS, "float32").values()) == {window}


def run_one_token(model) -> jax.Array:
    """One decode-shaped step: a single token at position 0 written to block 1."""
    backend = ReferenceBackend()
    dtype = model.model.embed_tokens.embedding[...].dtype
    specs = model.get_kv_cache_spec(16, KV_HEADS, "float32").values()
    caches = [jnp.zeros(backend.kv_cache_shape(2, 16, spec.num_kv_heads, spec.head_size), dtype) for spec in specs]
    md = AttentionMetadata(
        slot_mapping=jnp.asarray([16], jnp.int32),
        query_start_loc=jnp.asarray([0, 1], jnp.int32),
        seq_lens=jnp.asarray([1], jnp.int32),
        block_tables=jnp.asarray([[1]], jnp.int32),
        num_seqs=jnp.asarray([1], jnp.int32),
    )
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, caches, md):
        model = nnx.merge(graphdef, state)
        hidden, _ = model(jnp.asarray([3], jnp.int32), jnp.asarray([0], jnp.int32), caches, [md] * len(caches))
        return model.compute_logits(hidden)

    return step(state, caches, md)


def test_rules_table_maps_tp_axes_to_model_and_rejects_unknown_names():
    assert logical_to_mesh_axes(("vocab", "embed")) == PartitionSpec("model", None)
    assert logical_to_mesh_axes(("embed", "mlp")) == PartitionSpec(None, "model")
    assert logical_to_mesh_axes(("experts", "embed", None)) == PartitionSpec("model", None, None)
    with pytest.raises(ValueError, match="stages"):
        logical_to_mesh_axes(("stages",))


def test_fused_part_of_the_wrong_shape_is_named(tmp_path):
    save_hf(tmp_path, tiny_config())
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(path)
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.ones(HEAD_DIM, HIDDEN)
    safetensors.torch.save_file(tensors, path)
    config = model_config(tiny_config(), tmp_path, load_format="auto")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight.*\(16, 64\)"):
        get_model(config, ReferenceBackend())


def _with_tensors(path, **extra: torch.Tensor) -> None:
    tensors = safetensors.torch.load_file(path)
    safetensors.torch.save_file({**tensors, **extra}, path)


def test_kv_cache_scales_load_where_the_checkpoint_has_them(tmp_path):
    """vLLM's fp8 KV cache scales, under each name checkpoints use (`self_attn.k_scale`,
    ModelOpt's `k_proj.k_scale`, older llm-compressor's `k_proj.output_scale`), load as float32
    scalars replicated over the mesh; a layer without them keeps None (1.0)."""
    hf_model = save_hf(tmp_path, tiny_config(num_hidden_layers=3))
    _with_tensors(
        tmp_path / "model.safetensors",
        **{
            "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
            "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
            "model.layers.1.self_attn.k_proj.output_scale": torch.tensor([2.0]),
            "model.layers.1.self_attn.v_proj.v_scale": torch.tensor(4.0, dtype=torch.bfloat16),
        },
    )
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("model",))
    config = model_config(hf_model.config, tmp_path, dtype="bfloat16", load_format="auto")
    model = get_model(config, ReferenceBackend(), mesh=mesh)
    attns = [layer.self_attn for layer in model.model.layers]
    scales = [(attn.k_scale.get_value(), attn.v_scale.get_value()) for attn in attns]
    assert scales[2] == (None, None)
    for scale in jax.tree.leaves(scales[:2]):
        assert scale.dtype == jnp.float32 and scale.shape == ()
        assert scale.sharding == NamedSharding(mesh, PartitionSpec())
    assert [[float(s) for s in pair] for pair in scales[:2]] == [[0.5, 0.25], [2.0, 4.0]]


def test_kv_cache_scale_of_more_than_one_value_is_named(tmp_path):
    save_hf(tmp_path, tiny_config())
    _with_tensors(tmp_path / "model.safetensors", **{"model.layers.1.self_attn.k_scale": torch.ones(2)})
    config = model_config(tiny_config(), tmp_path, load_format="auto")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_scale.*k_scale must be one value"):
        get_model(config, ReferenceBackend())
