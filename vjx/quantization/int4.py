"""INT4 weight-only linear layers (W4A16) with a scale and a zero point per group of input
rows, the storage shared by the AWQ and GPTQ formats (awq.py, gptq.py).

On the devices, the kernel holds two 4-bit values per byte, [in / 2, *output dims] (row 2i in
the low nibble, row 2i + 1 in the high one); scales [groups, *output dims] in the model dtype,
zero points [groups, *output dims] as uint8. A checkpoint's packed int32 words are unpacked on
the host and repacked this way, so a fused layer joins its parts like any other tensor. With
act-order (GPTQ `desc_act`), input rows are sorted by group once after loading and the matmul
gathers the activations in the same order.

The matmul: on GPU, the Pallas W4A16 kernel (vjx/kernels/int4_matmul.py), which dequantizes
tiles as it reads them; under tensor parallelism it runs per device in a `shard_map` on the
device's shard of the weights (a row-parallel layer sums the devices' partial products).
Elsewhere, and for shapes the kernel's tiles do not divide, jnp dequantizes the weights to the
activations' dtype group by group inside the jitted step and multiplies.
"""

import abc
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vjx.kernels.int4_matmul import SYMMETRIC_ZERO, int4_matmul, kernel_fits
from vjx.models.layers.param import logical_axes_of, logical_param
from vjx.quantization.base import LinearMethod, abstract_param, add_bias, flat_shapes, out_axes
from vjx.sharding.constraints import mesh_spec

NIBBLES_PER_WORD = 8


def unpack_int32(words: np.ndarray, order: Sequence[int] = tuple(range(NIBBLES_PER_WORD))) -> np.ndarray:
    """int32 words [..., n] -> their 4-bit values [..., n * 8] (uint8), where nibble i (bits
    4i .. 4i + 3) of word c is value 8c + order[i]."""
    words = np.asarray(words).view(np.uint32)
    nibbles = np.stack([(words >> (4 * i)) & 0xF for i in range(NIBBLES_PER_WORD)], axis=-1).astype(np.uint8)
    values = np.empty_like(nibbles)
    values[..., list(order)] = nibbles
    return values.reshape(*words.shape[:-1], -1)


def pack_rows(values: np.ndarray) -> np.ndarray:
    """4-bit values [2n, ...] -> bytes [n, ...]: row 2i in the low nibble, 2i + 1 in the high."""
    values = values.astype(np.uint8)
    return values[0::2] | (values[1::2] << 4)


def unpack_rows(packed: Array) -> Array:
    """The inverse of `pack_rows`, on the devices."""
    return jnp.stack([packed & 0xF, packed >> 4], axis=1).reshape(-1, *packed.shape[1:])


@dataclasses.dataclass(frozen=True)
class Int4LinearMethod(LinearMethod, abc.ABC):
    """4-bit weights in groups of `group_size` input rows (-1: one group); a format says how
    its tensors unpack (`unpack_weight`, `unpack_zeros`) and names them (`HF_NAMES`)."""

    group_size: int
    act_order: bool = False

    @abc.abstractmethod
    def unpack_weight(self, tensor: np.ndarray) -> np.ndarray:
        """A part's packed weight -> its 4-bit values [in, part outputs]."""

    def unpack_zeros(self, tensor: np.ndarray) -> np.ndarray:
        """A part's packed zero points -> their values [groups, part outputs] (formats that
        store them)."""
        raise ValueError(f"{type(self).__name__} stores no zero points.")

    def create_weights(self, layer: nnx.Module) -> None:
        in_shape, out_shape = flat_shapes(layer)
        num_in = int(np.prod(in_shape))
        group_size = num_in if self.group_size == -1 else self.group_size
        if num_in % group_size or num_in % 2:
            raise ValueError(f"an INT4 layer's input size ({num_in}) must be even and a multiple of its group size.")
        in_axis, dtype = logical_axes_of(layer.kernel)[0], layer.kernel.dtype
        axes = (in_axis, *out_axes(layer))
        groups = num_in // group_size
        layer.kernel = abstract_param((num_in // 2, *out_shape), jnp.uint8, axes)
        layer.weight_scale = abstract_param((groups, *out_shape), dtype, axes)
        if self.has_zero_points:
            layer.weight_zero_point = abstract_param((groups, *out_shape), jnp.uint8, axes)
        if "g_idx" in self.HF_NAMES.values():
            layer.g_idx = abstract_param((num_in,), jnp.int32, (in_axis,))

    @property
    def has_zero_points(self) -> bool:
        """Whether the format stores zero points (else every zero point is 8: symmetric)."""
        return "weight_zero_point" in self.HF_NAMES.values()

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        if attr == "kernel":
            values = [self.unpack_weight(tensor).T for tensor in tensors]
            return pack_rows(layer.lay_out(values, (values[0].shape[1],)))
        if attr == "weight_scale":
            return layer.lay_out([np.asarray(tensor).T for tensor in tensors], (tensors[0].shape[0],))
        if attr == "weight_zero_point":
            zeros = [self.unpack_zeros(tensor).T for tensor in tensors]
            return layer.lay_out(zeros, (zeros[0].shape[1],))
        if attr == "g_idx":
            if any(not np.array_equal(tensor, tensors[0]) for tensor in tensors):
                raise ValueError("the parts of a fused layer must share one g_idx (their input is the same).")
            return np.asarray(tensors[0], np.int32)
        return super().to_param_layout(layer, attr, tensors)

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        """Drops `g_idx`; with act-order, sorts the input rows by group (the matmul gathers
        the activations by `input_perm`)."""
        if not hasattr(layer, "g_idx"):
            return
        g_idx = np.asarray(jax.device_get(layer.g_idx[...]))
        in_axis = logical_axes_of(layer.g_idx)[0]
        del layer.g_idx
        if not self.act_order:
            return
        perm = np.argsort(g_idx, kind="stable").astype(np.int32)
        groups = layer.weight_scale.shape[0]
        if not np.array_equal(g_idx[perm], np.arange(len(g_idx)) // (len(g_idx) // groups)):
            raise ValueError("g_idx must give every group the same number of input rows.")
        axes = logical_axes_of(layer.kernel)
        reorder = _reorder_fn(sharding_of(axes))
        layer.kernel = logical_param(reorder(layer.kernel[...], jnp.asarray(perm)), axes)
        layer.input_perm = logical_param(jax.device_put(perm, sharding_of((in_axis,))), (in_axis,))

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        in_shape, out_shape = flat_shapes(layer)
        num_in = int(np.prod(in_shape))
        batch_shape = x.shape[: x.ndim - len(in_shape)]
        x_BI = x.reshape(-1, num_in)
        if self.act_order:
            x_BI = jnp.take(x_BI, layer.input_perm[...], axis=1)
        zero = layer.weight_zero_point if self.has_zero_points else None
        y = int4_linear(x_BI, layer.kernel, layer.weight_scale, zero, use_kernel=jax.default_backend() == "gpu")
        return add_bias(layer, y.reshape(*batch_shape, *out_shape))


def int4_linear(
    x_BI: Float[Array, "B I"],
    kernel: nnx.Param,
    scale: nnx.Param,
    zero: nnx.Param | None,
    *,
    use_kernel: bool,
    interpret: bool = False,
) -> Float[Array, "B ..."]:
    """x [B, I] times the INT4 params (kernel [I / 2, *out], scale and zero [G, *out]) ->
    [B, *out]: with `use_kernel`, the Pallas kernel, per device under a mesh; else jnp."""
    values = [kernel[...], scale[...]] + ([] if zero is None else [zero[...]])
    local = functools.partial(_local_int4_linear, use_kernel=use_kernel, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if not use_kernel or mesh.empty or mesh.shape.get("model", 1) == 1:
        return local(x_BI, *values)
    axes = logical_axes_of(kernel)
    in_spec = mesh_spec(mesh, axes[:1])[0]
    out_spec = mesh_spec(mesh, ("tokens", *axes[1:]))

    def per_device(x_BI, *values):
        y = local(x_BI, *values)
        return y if in_spec is None else jax.lax.psum(y, in_spec)

    sharded = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(jax.sharding.PartitionSpec(None, in_spec), *(mesh_spec(mesh, axes) for _ in values)),
        out_specs=out_spec,
        check_vma=False,
    )
    return sharded(x_BI, *values)


def _local_int4_linear(x_BI, packed, scale, zero=None, *, use_kernel: bool, interpret: bool):
    """One device's product: packed [I / 2, *out] etc. flattened to [., O], then [B, *out]."""
    out_shape = packed.shape[1:]
    num_in, groups = x_BI.shape[1], scale.shape[0]
    packed_HO, scale_GO = packed.reshape(num_in // 2, -1), scale.reshape(groups, -1)
    zero_GO = None if zero is None else zero.reshape(groups, -1)
    group_size = num_in // groups
    if use_kernel and kernel_fits(num_in, packed_HO.shape[1], group_size):
        y_BO = int4_matmul(x_BI, packed_HO, scale_GO, zero_GO, group_size=group_size, interpret=interpret)
    else:
        y_BO = dequantized_matmul(x_BI, packed_HO, scale_GO, zero_GO)
    return y_BO.reshape(x_BI.shape[0], *out_shape)


def dequantized_matmul(x_BI, packed_HO, scale_GO, zero_GO=None) -> Array:
    """The jnp W4A16 product: the weights dequantized to x's dtype group by group, then a dot."""
    num_in, groups = x_BI.shape[1], scale_GO.shape[0]
    q_GKO = unpack_rows(packed_HO).reshape(groups, num_in // groups, -1)
    zero_G1O = jnp.asarray(SYMMETRIC_ZERO if zero_GO is None else zero_GO[:, None]).astype(x_BI.dtype)
    scale_G1O = scale_GO[:, None].astype(x_BI.dtype)
    w_IO = ((q_GKO.astype(x_BI.dtype) - zero_G1O) * scale_G1O).reshape(num_in, -1)
    return jnp.dot(x_BI, w_IO)


@functools.cache
def _reorder_fn(kernel_sharding):
    """Packed kernel, row order -> the packed kernel with its rows in that order."""

    def reorder(packed, perm):
        values = jnp.take(unpack_rows(packed), perm, axis=0)
        return values[0::2] | (values[1::2] << 4)

    return jax.jit(reorder, out_shardings=kernel_sharding)
