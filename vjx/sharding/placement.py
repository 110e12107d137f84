"""Placing weights on the mesh: each device receives only its own block of a tensor.

A checkpoint tensor is read (memory-mapped) on the host and handed to
`jax.make_array_from_callback`, which asks for one index per device; only that slice is cast
and copied, so no device ever holds more of a sharded weight than its shard, and no full
copy is staged on one device first.

When a model has fewer KV heads than devices on `model`, each KV head is repeated at load
time so that every device holds whole heads: head k becomes heads k*r .. k*r + r - 1 for
r = tensor_parallel_size / num_kv_heads. Query head n then still reads (a copy of) its own
KV head n // (num_heads / num_kv_heads), and the KV cache holds the repeated heads. In the
fused q/k/v projection, each copy takes 1 / r of its group's query heads along.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding


def kv_head_replicas(num_kv_heads: int, tensor_parallel_size: int) -> int:
    """Copies of each KV head tensor parallelism needs (1 unless there are fewer KV heads than
    devices); raises ValueError when neither count divides the other."""
    if num_kv_heads >= tensor_parallel_size:
        if num_kv_heads % tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size ({tensor_parallel_size}) must divide the model's "
                f"num_key_value_heads ({num_kv_heads}), or be a multiple of it."
            )
        return 1
    if tensor_parallel_size % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size ({tensor_parallel_size}) must be a multiple of the model's "
            f"num_key_value_heads ({num_kv_heads}) when it exceeds it."
        )
    return tensor_parallel_size // num_kv_heads


def num_cache_kv_heads(num_kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads the cache holds: the model's, each repeated when there are fewer than devices."""
    return num_kv_heads * kv_head_replicas(num_kv_heads, tensor_parallel_size)


def repeat_kv_heads(tensor, logical_axes: tuple[str | None, ...], replicas: int):
    """`tensor` (numpy or jax) with each KV head on its `kv_heads` axis repeated `replicas`
    times, in place order; other tensors unchanged.

    A fused q/k/v tensor (a `qkv` axis right after `kv_heads`: each kv head's G query heads,
    then its key and value head) instead splits each group's query heads over the copies:
    copy j of kv head k keeps query heads k * G + j * G / r .. + G / r - 1, so query head n
    still meets (a copy of) kv head n // G, and each copy is a whole group of the new layout.
    """
    if replicas == 1 or "kv_heads" not in logical_axes:
        return tensor
    xp = np if isinstance(tensor, np.ndarray) else jnp
    axis = logical_axes.index("kv_heads")
    if "qkv" not in logical_axes:
        return xp.repeat(tensor, replicas, axis=axis)
    num_q = tensor.shape[axis + 1] - 2
    q, kv = xp.split(tensor, [num_q], axis=axis + 1)
    shape = q.shape
    q = q.reshape(*shape[:axis], shape[axis] * replicas, num_q // replicas, *shape[axis + 2 :])
    return xp.concatenate([q, xp.repeat(kv, replicas, axis=axis)], axis=axis + 1)


def place(host: np.ndarray, dtype, sharding: Sharding) -> jax.Array:
    """`host` as a `dtype` array laid out by `sharding`; each device's slice is cast and copied
    on its own."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: _block(host, index, dtype))


def put_replicated(host: np.ndarray, sharding: Sharding) -> jax.Array:
    """`host` whole on every device of `sharding`. Over several processes each process puts its
    own copy: all hold the same value (rank 0's), so `jax.device_put`'s check that they do, an
    all-gather of `host` on every call, is skipped."""
    if sharding.is_fully_addressable:
        return jax.device_put(host, sharding)
    return place(host, host.dtype, sharding)


def _block(host: np.ndarray, index: tuple[slice, ...], dtype) -> np.ndarray:
    block = host[index]
    return np.ascontiguousarray(block).reshape(np.shape(block)).astype(dtype, copy=False)


def filled(shape: tuple[int, ...], dtype, value, sharding: Sharding) -> jax.Array:
    """A constant array created in place on the devices of `sharding` (e.g. a zeroed KV cache),
    never staged whole on the host or on one device."""
    return _filled_fn(tuple(shape), jnp.dtype(dtype), value, sharding)()


@functools.cache
def _filled_fn(shape: tuple[int, ...], dtype, value, sharding: Sharding):
    return jax.jit(lambda: jnp.full(shape, value, dtype), out_shardings=sharding)


def abstract_like(tree):
    """Each array of `tree` as a `ShapeDtypeStruct` with its sharding, for AOT lowering."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
