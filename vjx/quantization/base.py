"""vLLM's quantization interface: a `QuantizationConfig` picks each linear layer's method, and
the method owns the layer's weights after loading and its matmul.

A `*Linear` layer calls `self.quant_method.apply(self, x)`; every layer starts with the
unquantized method (a plain einsum). After the loader has filled the weights, it asks the
config for each layer's method by the layer's checkpoint prefix, lets the method rewrite the
layer's params (`process_weights_after_loading`) and sets it on the layer, so no model file
knows about quantization.
"""

import abc
import dataclasses

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float


class LinearMethod(abc.ABC):
    """How one linear layer stores its kernel and computes y = x @ kernel (+ bias).

    Methods are frozen dataclasses: they sit in the model's graph as static attributes, which
    must be hashable."""

    @abc.abstractmethod
    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        """Turns the layer's loaded params into the method's; `sharding_of(logical_axes)` is
        where a param with those axes lives."""

    @abc.abstractmethod
    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """The layer's output for `x`, bias included."""


@dataclasses.dataclass(frozen=True)
class UnquantizedLinearMethod(LinearMethod):
    """The kernel in the model's dtype: one einsum."""

    def process_weights_after_loading(self, layer: nnx.Module, sharding_of) -> None:
        """The loaded kernel is already this method's."""

    def apply(self, layer: nnx.Module, x: Float[Array, "..."]) -> Float[Array, "..."]:
        return add_bias(layer, jnp.einsum(layer.einsum_str, x, layer.kernel[...]))


class QuantizationConfig(abc.ABC):
    """A quantization scheme (vLLM's name): chosen by `quantization=` or read from a
    checkpoint's `quantization_config`."""

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The `quantization=` value that selects it."""

    @abc.abstractmethod
    def get_quant_method(self, layer: nnx.Module, prefix: str) -> LinearMethod | None:
        """The method of the linear layer at checkpoint prefix `prefix` (e.g.
        "model.layers.0.self_attn.qkv_proj"), or None to keep it unquantized."""


def add_bias(layer: nnx.Module, y: Float[Array, "..."]) -> Float[Array, "..."]:
    return y if layer.bias is None else y + layer.bias[...]


def flat_shapes(layer: nnx.Module) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The kernel's contracted (input) dimensions and its output dimensions."""
    shape = layer.kernel.shape
    return shape[: layer.num_in_dims], shape[layer.num_in_dims :]
