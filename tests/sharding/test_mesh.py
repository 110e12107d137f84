"""Mesh construction, the rules table, and the errors for layouts that cannot work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.helpers.tiny_llama import save_tiny_llama, tiny_config
from vjx import EngineArgs
from vjx.config import ParallelConfig
from vjx.models.registry import verify_tensor_parallel
from vjx.sharding.constraints import constrain, replicate
from vjx.sharding.mesh import device_groups, make_mesh, model_axis_size
from vjx.sharding.placement import filled, kv_head_replicas, num_cache_kv_heads
from vjx.sharding.rules import logical_sharding, logical_to_mesh_axes


def test_eight_fake_devices():
    assert len(jax.devices()) == 8


def test_replica_meshes_take_consecutive_device_groups():
    config = ParallelConfig(tensor_parallel_size=2, data_parallel_size=3, data_parallel_rank=2)
    mesh = make_mesh(config)
    assert mesh.axis_names == ("data", "model") and dict(mesh.shape) == {"data": 1, "model": 2}
    assert [d.id for d in mesh.devices.flat] == [4, 5]
    assert [[d.id for d in g] for g in device_groups(config)] == [[0, 1], [2, 3], [4, 5]]
    assert model_axis_size(mesh) == 2 and model_axis_size(None) == 1
    assert [d.id for d in make_mesh(ParallelConfig()).devices.flat] == [0]


def test_more_devices_than_exist_is_a_value_error():
    with pytest.raises(ValueError, match=r"4 x 1 x 4 = 16 devices, but only 8 are available"):
        device_groups(ParallelConfig(tensor_parallel_size=4, data_parallel_size=4))
    with pytest.raises(ValueError, match=r"2 x 4 x 2 = 16 devices, but only 8 are available"):
        device_groups(ParallelConfig(tensor_parallel_size=2, data_parallel_size=2, pipeline_parallel_size=4))
    with pytest.raises(ValueError, match=r"data_parallel_rank must be in \[0, 1\], got 2"):
        make_mesh(ParallelConfig(data_parallel_size=2, data_parallel_rank=2))


def test_rules_table_specs():
    assert logical_to_mesh_axes(("embed", "heads", "head_dim")) == P(None, "model", None)
    assert logical_to_mesh_axes(("embed", "kv_heads", "head_dim")) == P(None, "model", None)
    assert logical_to_mesh_axes(("heads", "head_dim", "embed")) == P("model", None, None)
    assert logical_to_mesh_axes(("mlp", "embed")) == P("model", None)
    assert logical_to_mesh_axes(("tokens", "embed")) == P(None, None)
    assert logical_to_mesh_axes(("vocab", "embed")) == P("model", None)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=2))
    assert logical_sharding(mesh, ("embed", "vocab")) == NamedSharding(mesh, P(None, "model"))


def test_kv_head_replicas():
    assert [kv_head_replicas(8, tp) for tp in (1, 2, 4, 8)] == [1, 1, 1, 1]
    assert [kv_head_replicas(1, tp) for tp in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert kv_head_replicas(2, 8) == 4 and kv_head_replicas(3, 3) == 1
    with pytest.raises(
        ValueError, match=r"tensor_parallel_size \(2\) must divide the model's num_key_value_heads \(3\)"
    ):
        kv_head_replicas(3, 2)
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(8\) must be a multiple of .* \(3\)"):
        kv_head_replicas(3, 8)
    assert num_cache_kv_heads(2, 8) == 8
    assert num_cache_kv_heads(2, 1) == 2


@pytest.mark.parametrize(
    ("overrides", "tp", "message"),
    [
        (dict(), 3, r"must divide the model's num_attention_heads \(8\)"),
        (
            dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=48, head_dim=8),
            2,
            r"num_key_value_heads \(3\)",
        ),
        (
            dict(vocab_size=300),
            8,
            r"must divide the model's vocab_size \(300\); divisors up to 8: \[1, 2, 3, 4, 5, 6\]",
        ),
        (dict(intermediate_size=100), 8, r"intermediate_size \(100\)"),
    ],
)
def test_layouts_that_do_not_split_are_value_errors(overrides, tp, message):
    num_kv_heads = overrides.pop("num_key_value_heads", 2)
    with pytest.raises(ValueError, match=message):
        verify_tensor_parallel(tiny_config(num_kv_heads, **overrides), tp)


def test_engine_args_refuse_impossible_layouts(tmp_path):
    save_tiny_llama(tmp_path, 2)
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(3\) must divide the model's num_attention_heads"):
        EngineArgs(str(tmp_path), tensor_parallel_size=3).create_engine_config()
    with pytest.raises(ValueError, match="only 8 are available"):
        EngineArgs(str(tmp_path), tensor_parallel_size=8, data_parallel_size=2).create_engine_config()
    with pytest.raises(ValueError, match="data_parallel_size must be >= 1, got 0"):
        EngineArgs(str(tmp_path), data_parallel_size=0).create_engine_config()
    config = EngineArgs(str(tmp_path), tensor_parallel_size=4, data_parallel_size=2).create_engine_config()
    assert config.parallel_config == ParallelConfig(4, 2, 0)
    assert config.for_data_parallel_rank(1).parallel_config.data_parallel_rank == 1


def test_constraints_are_no_ops_without_a_mesh_and_pin_layouts_under_one():
    x = jnp.arange(16.0).reshape(2, 8)
    assert constrain(x, ("tokens", "vocab")) is x
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))

    def f(x):
        return replicate(constrain(x * 2, ("tokens", "vocab")) + 1)

    with jax.set_mesh(mesh):
        out = jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P())))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2 + 1)
    assert out.sharding.spec == P()


def test_filled_arrays_are_created_sharded():
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    array = filled((2, 8, 4), jnp.float32, -1, NamedSharding(mesh, P(None, None, "model")))
    assert {s.data.shape for s in array.addressable_shards} == {(2, 8, 1)}
    assert {s.device.id for s in array.addressable_shards} == {0, 1, 2, 3}
    np.testing.assert_array_equal(np.asarray(array), -np.ones((2, 8, 4), np.float32))
