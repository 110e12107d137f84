"""Projections whose kernels keep heads as their own axis, and the token embedding.

A `Linear` is an einsum whose kernel lists the contracted input dimensions first and the
output dimensions after them, e.g. q_proj "TD,DNH->TNH" with kernel [D, N, H]. That is the
transpose of torch's `nn.Linear.weight` [out, in], reshaped; keeping N and H apart lets the
sharding table split heads without reshapes in the model.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.models.layers.param import HFParamLayer, logical_param

INIT_STDDEV = 0.02
"""Standard deviation of freshly initialized kernels and embeddings."""


class Linear(nnx.Module, HFParamLayer):
    """y = einsum(x, kernel) (+ bias), computed in the params' dtype."""

    HF_NAMES = {"weight": "kernel", "bias": "bias"}

    def __init__(
        self,
        einsum_str: str,
        shape: tuple[int, ...],
        logical_axes: tuple[str | None, ...],
        *,
        use_bias: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        self.einsum_str = einsum_str
        self.num_in_dims = _num_contracted_dims(einsum_str)
        kernel = jax.random.normal(rngs.params(), shape, dtype) * jnp.asarray(INIT_STDDEV, dtype)
        self.kernel = logical_param(kernel, logical_axes)
        out_shape = shape[self.num_in_dims :]
        self.bias = (
            logical_param(jnp.zeros(out_shape, dtype), logical_axes[self.num_in_dims :])
            if use_bias
            else None
        )

    def __call__(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        y = jnp.einsum(self.einsum_str, x, self.kernel[...])
        if self.bias is not None:
            y = y + self.bias[...]
        return y

    def to_param_layout(self, attr: str, tensor: np.ndarray) -> np.ndarray:
        """torch's weight [prod(out dims), prod(in dims)] -> kernel [*in dims, *out dims]."""
        if attr == "kernel":
            return tensor.T.reshape(self.kernel.shape)
        return tensor.reshape(self.bias.shape)


class Embedding(nnx.Module, HFParamLayer):
    """Token embedding table [V, D]; `attend` reuses it as a tied LM head."""

    HF_NAMES = {"weight": "embedding"}

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        table = jax.random.normal(rngs.params(), (vocab_size, hidden_size), dtype)
        self.embedding = logical_param(table * jnp.asarray(INIT_STDDEV, dtype), ("vocab", "embed"))

    def __call__(self, input_ids: Int[Array, "T"]) -> Float[Array, "T D"]:
        return jnp.take(self.embedding[...], input_ids, axis=0)

    def attend(self, x: Float[Array, "R D"]) -> Float[Array, "R V"]:
        return jnp.einsum("RD,VD->RV", x, self.embedding[...])


def _num_contracted_dims(einsum_str: str) -> int:
    """Leading kernel dimensions that the input contracts; checks the kernel's order."""
    inputs, output = einsum_str.replace(" ", "").split("->")
    x_dims, kernel_dims = inputs.split(",")
    contracted = [d for d in kernel_dims if d in x_dims and d not in output]
    num_in = len(contracted)
    if kernel_dims[:num_in] != "".join(contracted) or not all(
        d in output for d in kernel_dims[num_in:]
    ):
        raise ValueError(
            f"einsum_str must list the kernel's contracted dimensions first, got {einsum_str!r}."
        )
    return num_in
