"""Loading onto a mesh: each device receives only its own block of each weight.

A spy on `jax.make_array_from_callback` records every block the loader hands a device, and
`jax.device_put` must not be called at all while loading: no weight is staged whole on one
device before it is split. Dummy weights do not depend on the mesh.
"""

import jax
import numpy as np
import pytest
import transformers
from flax import nnx

from tests.helpers.tiny_llama import save_tiny_llama, tiny_config
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ModelConfig, ParallelConfig
from vjx.models.loader import get_model
from vjx.sharding.mesh import make_mesh


def _model_config(path, hf_config, load_format="auto") -> ModelConfig:
    return ModelConfig(
        model=str(path),
        tokenizer=str(path),
        hf_config=hf_config,
        dtype="float32",
        max_model_len=64,
        seed=0,
        load_format=load_format,
    )


@pytest.fixture()
def spies(monkeypatch):
    blocks, puts = [], []
    real = jax.make_array_from_callback

    def spy(shape, sharding, callback, *args, **kwargs):
        def recording(index):
            block = callback(index)
            blocks.append((tuple(shape), sharding.shard_shape(tuple(shape)), block.shape))
            return block

        return real(shape, sharding, recording, *args, **kwargs)

    monkeypatch.setattr(jax, "make_array_from_callback", spy)
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: puts.append(a) or pytest.fail("device_put while loading"))
    return blocks, puts


def _params(model) -> list[jax.Array]:
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_safetensors_load_never_places_a_whole_sharded_weight(tmp_path, spies):
    save_tiny_llama(tmp_path, 2)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    model = get_model(_model_config(tmp_path, tiny_config(2)), ShardedBackend(ReferenceBackend()), mesh=mesh)
    blocks, puts = spies
    assert not puts
    for _, shard_shape, block_shape in blocks:
        assert block_shape == shard_shape
    # 4 projections per layer (q/k/v and gate/up fused), the embedding and the LM head: one
    # quarter per device. The 5 norms are replicated, read once.
    sharded = [b for b in blocks if b[1] != b[0]]
    assert len(sharded) == (2 * 4 + 2) * 4
    assert len(blocks) == len(sharded) + 5
    for param in _params(model):
        assert len(param.addressable_shards) == 4
        assert {s.data.shape for s in param.addressable_shards} == {param.sharding.shard_shape(param.shape)}


def test_one_device_load_is_unchanged(tmp_path):
    hf_model = save_tiny_llama(tmp_path, 2)
    model = get_model(_model_config(tmp_path, tiny_config(2)), ReferenceBackend())
    expected = hf_model.model.layers[0].mlp.down_proj.weight.detach().numpy().T
    np.testing.assert_array_equal(np.asarray(model.model.layers[0].mlp.down_proj.kernel[...]), expected)


def test_dummy_weights_do_not_depend_on_the_mesh():
    config = _model_config("/nonexistent", tiny_config(2), load_format="dummy")
    one = get_model(config, ReferenceBackend())
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=8))
    eight = get_model(config, ShardedBackend(ReferenceBackend()), mesh=mesh)
    for layer_one, layer_eight in zip(one.model.layers, eight.model.layers):
        one_kernel = np.asarray(layer_one.self_attn.qkv_proj.kernel[...])
        eight_kernel = np.asarray(layer_eight.self_attn.qkv_proj.kernel[...])
        # 2 KV heads, each repeated on 4 of the 8 devices with a quarter of its query heads.
        num_q = one_kernel.shape[2] - 2
        assert eight_kernel.shape == (64, 8, num_q // 4 + 2, 8)
        np.testing.assert_array_equal(
            one_kernel[:, :, :num_q].reshape(64, -1, 8), eight_kernel[:, :, :-2].reshape(64, -1, 8)
        )
        np.testing.assert_array_equal(np.repeat(one_kernel[:, :, -2:], 4, axis=1), eight_kernel[:, :, -2:])
        gate_up_one = np.asarray(layer_one.mlp.gate_up_proj.kernel[...])
        np.testing.assert_array_equal(gate_up_one, np.asarray(layer_eight.mlp.gate_up_proj.kernel[...]))
    np.testing.assert_array_equal(np.asarray(one.lm_head.kernel[...]), np.asarray(eight.lm_head.kernel[...]))


def test_hf_config_is_not_changed_by_the_repeat(tmp_path):
    save_tiny_llama(tmp_path, 1)
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    model = get_model(_model_config(tmp_path, hf_config), ShardedBackend(ReferenceBackend()), mesh=mesh)
    assert hf_config.num_key_value_heads == 1
    assert model.model.layers[0].self_attn.qkv_proj.kernel[...].shape[:2] == (64, 4)
