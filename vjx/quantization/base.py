"""vLLM's quantization interface: a `QuantizationConfig` picks each linear layer's method, and
the method owns the layer's weights after loading and its matmul.

A `*Linear` layer calls `self.quant_method.apply(self, x)`; every layer starts with the
unquantized method (a plain einsum). Before loading, the loader asks the config for each
layer's method by the layer's checkpoint prefix and sets it on the layer; the method declares
the params it stores (`create_weights`: e.g. an FP8 kernel and its scales), names the
checkpoint tensors that fill them (`HF_NAMES`) and lays each one out (`to_param_layout`, by way
of the layer's own `lay_out`, which knows how its fused parts join). Once every param is
filled, `process_weights_after_loading` may rewrite them (quantizing at load, reordering), so
no model file knows about quantization.
"""

import abc
import dataclasses
import re
from collections.abc import Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.matmul import dense
from vjx.models.layers.param import logical_axes_of, logical_param


class LinearMethod(abc.ABC):
    """How one linear layer stores its kernel and computes y = x @ kernel (+ bias).

    Methods are frozen dataclasses: they sit in the model's graph as static attributes, which
    must be hashable."""

    HF_NAMES: ClassVar[dict[str, str]] = {"weight": "kernel"}
    """Checkpoint tensor name (last part) -> the param it fills (the bias is the layer's)."""

    def create_weights(self, layer: nnx.Module) -> None:
        """Replaces the layer's abstract params with the ones this method loads (the default
        loads the model-dtype kernel)."""
        return None

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        """The checkpoint parts of `attr` in the param's layout: a weight [out, in] as the
        kernel, anything else as one value per output channel."""
        if attr == "kernel":
            return layer.lay_out(tensors, layer.in_shape)
        return layer.lay_out(tensors)

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        """Rewrites the layer's loaded params, if the method stores something else than it
        loads; `sharding_of(logical_axes)` is where a param with those axes lives."""
        return None

    @abc.abstractmethod
    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """The layer's output for `x`, bias included."""


@dataclasses.dataclass(frozen=True)
class UnquantizedLinearMethod(LinearMethod):
    """The kernel in the model's dtype: one GEMM."""

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        return add_bias(layer, dense(x, layer.kernel[...], layer.num_in_dims))


class QuantizationConfig(abc.ABC):
    """A quantization scheme (vLLM's name): chosen by `quantization=` or read from a
    checkpoint's `quantization_config`."""

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The `quantization=` value that selects it."""

    @classmethod
    def from_config(cls, config: dict) -> "QuantizationConfig":
        """The config of a checkpoint's `quantization_config` (its `quant_method` is this
        config's name); raises ValueError for a variant vjx does not load."""
        raise ValueError(f"vjx quantizes {cls.get_name()!r} only at load; it loads no such checkpoint.")

    @abc.abstractmethod
    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        """The method of the linear layer at checkpoint prefix `prefix` (e.g.
        "model.layers.0.self_attn.qkv_proj"), or None to keep it unquantized."""

    def get_moe_method(self, layer: nnx.Module, prefix: str) -> "FusedMoEMethod | None":
        """The method of the MoE experts at `prefix` (e.g. "model.layers.0.mlp.experts"), or
        None to keep them unquantized; a scheme that has none refuses MoE models."""
        raise ValueError(f"quantization {self.get_name()!r} has no method for MoE experts in vjx ({prefix}).")


class FusedMoEMethod:
    """How a `FusedMoE` layer's expert weights are loaded and stored (vLLM's
    `FusedMoEMethodBase`); this base is the unquantized method. Methods are frozen
    dataclasses, like `LinearMethod`s.

    `hf_tensors` may rename the layer's checkpoint tensors (`layer.checkpoint_tensors`) and
    `to_param_layout` turn what it loads into the unquantized tensors before the layer lays
    them out (`layer.checkpoint_layout`); `process_weights_after_loading` may then store the
    weights otherwise, with the scales `fused_experts` applies (`w13_scale`, `w2_scale`)."""

    def create_weights(self, layer: nnx.Module) -> None:
        return None

    def hf_tensors(self, layer: nnx.Module, tensors: dict) -> dict:
        return tensors

    def to_param_layout(self, layer: nnx.Module, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        return layer.checkpoint_layout(attr, tensors)

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class UnquantizedFusedMoEMethod(FusedMoEMethod):
    """The experts' weights in the model's dtype."""


def add_bias(layer: nnx.Module, y: Float[Array, "..."]) -> Float[Array, "..."]:
    return y if layer.bias is None else y + layer.bias[...]


def flat_shapes(layer: nnx.Module) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The layer's contracted (input) dimensions and its output dimensions: the kernel's last
    ones in every method's layout (KV heads included once the loader has repeated them)."""
    return layer.in_shape, tuple(layer.kernel.shape[-len(layer.out_shape) :])


def abstract_param(shape: tuple[int, ...], dtype, logical_axes: tuple[str | None, ...]) -> nnx.Param:
    """A param of `shape` and `dtype` that the loader fills."""
    return logical_param(jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype)), logical_axes)


def out_axes(layer: nnx.Module) -> tuple[str | None, ...]:
    """The logical axes of the layer's output dimensions."""
    return logical_axes_of(layer.kernel)[layer.num_in_dims :]


def per_output(layer: nnx.Module, tensors: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each part's scale as one value per output row: a per-tensor scale (one element) is
    repeated over the part's rows, which multiplies the same values."""
    return [
        np.broadcast_to(tensor.reshape(()), (width,)) if tensor.size == 1 else tensor.reshape(width)
        for tensor, width in zip(tensors, layer.part_widths(), strict=True)
    ]


def is_layer_skipped(layer: nnx.Module, prefix: str, ignored: Sequence[str]) -> bool:
    """Whether the checkpoint left the layer at `prefix` unquantized: `ignored` names modules
    exactly or, prefixed "re:", by a regular expression; a fused layer is skipped when its
    parts are, and all of its parts must agree."""
    parent = prefix.rpartition(".")[0]
    names = [f"{parent}.{part}" if parent else part for part in layer.HF_PARTS] or [prefix]
    skipped = {any(_matches(name, pattern) for pattern in ignored) for name in names}
    if len(skipped) > 1:
        raise ValueError(f"the checkpoint quantizes only some of {names}, which vjx runs as one layer.")
    return skipped.pop()


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern
