"""Projections whose kernels keep heads as their own axis, and the token embedding.

A `Linear` is an einsum whose kernel lists the contracted input dimensions first and the
output dimensions after them, e.g. q_proj "TD,DNH->TNH" with kernel [D, N, H]. That is the
transpose of torch's `nn.Linear.weight` [out, in], reshaped; keeping N and H apart lets the
sharding table split heads without reshapes in the model.

Projections of the same input share one GEMM, as in vLLM: `QKVLinear` (q, k and v) and
`MergedLinear` (gate and up). At decode batch sizes a GEMM is a read of its weight, and one
read of the fused weight is faster than three or two launches over its parts (H200, Llama-3.1-8B
shapes, 8 tokens: q+k+v 28.8 us -> 14.2 us, gate+up 61.4 us -> 55.6 us per layer).
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.models.layers.matmul import matmul
from vjx.models.layers.param import HFParamLayer, logical_param
from vjx.quantization.base import LinearMethod, UnquantizedLinearMethod

INIT_STDDEV = 0.02
"""Standard deviation of freshly initialized kernels and embeddings."""


class Linear(nnx.Module, HFParamLayer):
    """y = einsum(x, kernel) (+ bias), computed in the params' dtype, or by the layer's
    quantization method (vjx/quantization/), which the loader sets before loading: the method
    names the checkpoint tensors the layer reads and the params they fill.

    `in_shape` and `out_shape` are the kernel's input and output dimensions as the checkpoint
    has them (before the loader repeats KV heads for tensor parallelism)."""

    quant_method: LinearMethod = UnquantizedLinearMethod()
    lora: nnx.Module | None = None
    """A LoRA companion (vjx/lora/layers.py) adding each token's adapter delta to the output;
    None: no LoRA, the layer is its method alone."""

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
        self.in_shape = tuple(shape[: self.num_in_dims])
        self.out_shape = tuple(shape[self.num_in_dims :])
        kernel = jax.random.normal(rngs.params(), shape, dtype) * jnp.asarray(INIT_STDDEV, dtype)
        self.kernel = logical_param(kernel, logical_axes)
        out_axes = logical_axes[self.num_in_dims :]
        self.bias = logical_param(jnp.zeros(self.out_shape, dtype), out_axes) if use_bias else None

    @property
    def HF_NAMES(self) -> dict[str, str]:
        return {**self.quant_method.HF_NAMES, "bias": "bias"}

    def __call__(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        y = self.quant_method.apply(self, x)
        if self.lora is not None:
            y = y + self.lora(x).astype(y.dtype)
        return y

    def to_param_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        return self.quant_method.to_param_layout(self, attr, tensors)

    def lay_out(self, tensors: Sequence[np.ndarray], in_shape: tuple[int, ...] = ()) -> np.ndarray:
        """torch-layout parts [part's output rows, *rest] -> [*in_shape, *output dims], where
        `rest` flattens to prod(in_shape): a weight [out, in] becomes the kernel with in_shape
        the input dims, a bias or per-channel scale [out] becomes [*output dims] (in_shape ())."""
        rows = [tensor.reshape(tensor.shape[0], -1).T for tensor in tensors]
        joined = self.join_outputs(rows)
        return joined.reshape(*in_shape, *joined.shape[1:])

    def join_outputs(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """The parts' [R, part outputs] arrays -> [R, *output dims]."""
        (row,) = rows
        return row.reshape(row.shape[0], *self.out_shape)

    def part_widths(self) -> tuple[int, ...]:
        """Output rows of each checkpoint part, in `HF_PARTS` order."""
        return (int(np.prod(self.out_shape)),)


class QKVLinear(Linear):
    """q, k and v in one GEMM: kernel [D, K, G + 2, H] on axes (embed, kv_heads, qkv, head_dim).

    Along `qkv`, each kv head k holds its G = N / K query heads (k * G .. k * G + G - 1),
    then its key head, then its value head, so splitting kv heads over devices keeps every
    group whole. Returns q [T, N, H], k [T, K, H], v [T, K, H]. (When the loader repeats kv
    heads for tensor parallelism, the kernel holds K * r groups of G / r query heads; the
    call reads the group size from the kernel.)
    """

    HF_PARTS = ("q_proj", "k_proj", "v_proj")

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        use_bias: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        shape = (hidden_size, num_kv_heads, num_heads // num_kv_heads + 2, head_dim)
        super().__init__(
            "TD,DKCH->TKCH", shape, ("embed", "kv_heads", "qkv", "head_dim"), use_bias=use_bias, dtype=dtype, rngs=rngs
        )

    def __call__(self, x: Float[Array, "T D"]) -> tuple[Float[Array, "T N H"], ...]:
        y_TKCH = super().__call__(x)
        num_tokens, _, num_parts, head_dim = y_TKCH.shape
        q_TNH = y_TKCH[:, :, : num_parts - 2].reshape(num_tokens, -1, head_dim)
        return q_TNH, y_TKCH[:, :, num_parts - 2], y_TKCH[:, :, num_parts - 1]

    def join_outputs(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """q_proj, k_proj, v_proj rows [R, heads * H] -> the groups [R, K, G + 2, H]."""
        num_kv_heads, _, head_dim = self.out_shape
        groups = [row.reshape(row.shape[0], num_kv_heads, -1, head_dim) for row in rows]
        return np.concatenate(groups, axis=2)

    def part_widths(self) -> tuple[int, ...]:
        num_kv_heads, num_parts, head_dim = self.out_shape
        return (num_kv_heads * (num_parts - 2) * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)


class FusedQKVLinear(QKVLinear):
    """A `QKVLinear` whose checkpoint already fuses q, k and v in one tensor at its own path
    (Phi-3's `qkv_proj`: rows [q heads | k heads | v heads])."""

    HF_PARTS = ()

    def join_outputs(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        (row,) = rows
        return super().join_outputs(np.split(row, np.cumsum(super().part_widths())[:-1], axis=1))

    def part_widths(self) -> tuple[int, ...]:
        return (int(np.prod(self.out_shape)),)


class MergedLinear(Linear):
    """Several projections of the same input in one GEMM: kernel [D, P, F] for the P
    checkpoint modules `parts` (siblings of this one), each of width F along `out_axis`.
    Returns the P outputs [T, F] in `parts` order."""

    def __init__(
        self,
        parts: tuple[str, ...],
        in_features: int,
        out_features: int,
        logical_axes: tuple[str, str],
        *,
        use_bias: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        in_axis, out_axis = logical_axes
        super().__init__(
            "TD,DPF->TPF",
            (in_features, len(parts), out_features),
            (in_axis, None, out_axis),
            use_bias=use_bias,
            dtype=dtype,
            rngs=rngs,
        )
        self.HF_PARTS = parts

    def __call__(self, x: Float[Array, "T D"]) -> tuple[Float[Array, "T F"], ...]:
        y_TPF = super().__call__(x)
        return tuple(y_TPF[:, part] for part in range(y_TPF.shape[1]))

    def join_outputs(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """The parts' rows [R, F], stacked on the parts axis."""
        return np.stack(rows, axis=1)

    def part_widths(self) -> tuple[int, ...]:
        num_parts, width = self.out_shape
        return (width,) * num_parts


class FusedMergedLinear(MergedLinear):
    """A `MergedLinear` whose checkpoint already stacks its parts in one tensor at its own path
    (Phi-3's `gate_up_proj`: rows [gate | up])."""

    def __init__(self, num_parts: int, *args, **kwargs):
        super().__init__(tuple(f"part{i}" for i in range(num_parts)), *args, **kwargs)
        self.HF_PARTS = ()

    def join_outputs(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        (row,) = rows
        return super().join_outputs(np.split(row, self.out_shape[0], axis=1))

    def part_widths(self) -> tuple[int, ...]:
        return (int(np.prod(self.out_shape)),)


class Embedding(nnx.Module, HFParamLayer):
    """Token embedding table [V, D]; `attend` reuses it as a tied LM head."""

    HF_NAMES = {"weight": "embedding"}

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        table = jax.random.normal(rngs.params(), (vocab_size, hidden_size), dtype)
        self.embedding = logical_param(table * jnp.asarray(INIT_STDDEV, dtype), ("vocab", "embed"))

    def __call__(self, input_ids: Int[Array, " T"]) -> Float[Array, "T D"]:
        return jnp.take(self.embedding[...], input_ids, axis=0)

    def attend(self, x: Float[Array, "R D"]) -> Float[Array, "R V"]:
        return matmul(x, self.embedding[...], w_axis=1)


def _num_contracted_dims(einsum_str: str) -> int:
    """Leading kernel dimensions that the input contracts; checks the kernel's order."""
    inputs, output = einsum_str.replace(" ", "").split("->")
    x_dims, kernel_dims = inputs.split(",")
    contracted = [d for d in kernel_dims if d in x_dims and d not in output]
    num_in = len(contracted)
    lead = x_dims[: len(x_dims) - num_in]
    if kernel_dims[:num_in] != "".join(contracted) or x_dims != lead + kernel_dims[:num_in]:
        raise ValueError(
            f"einsum_str must contract x's last dimensions with the kernel's first, in order, got {einsum_str!r}."
        )
    if output != lead + kernel_dims[num_in:]:
        raise ValueError(f"einsum_str's output must be x's other dimensions, then the kernel's, got {einsum_str!r}.")
    return num_in
