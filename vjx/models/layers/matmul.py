"""A projection's product as one GEMM over a single contracted axis, in the form XLA:CPU
runs fast.

A kernel keeps heads as their own axes ([D, N, H], [N, H, D]); `dense` flattens the
contracted dimensions into one, so the product is a GEMM with one contracted axis. As an
einsum over two contracted axes, o_proj's [N, H, D] let XLA:CPU pick a layout that
transposed the whole weight on every step (SmolLM2-135M: 30 copies of 1.3 MB a step, about
a tenth of a decode step on two cores). The output dimensions stay apart: merging them
would merge a sharded minor axis (gate_up's [D, 2, F] split over F), which the partitioner
can only do by gathering the weight.

On the CPU a 16-bit product also accumulates in float32 and never has a single row: that
is the form XLA:CPU hands to its AMX / AVX-512 bf16 GEMM. A bf16 x bf16 -> bf16 product, or
one row, falls back to a generic loop about 5x slower (two cores, SmolLM2-shaped layers:
bf16 at 1 row 172 ms, 2 rows 36 ms; float32 accumulation and 2 rows for 1 row: 38 ms).
Accelerators keep XLA's own choice (float32 accumulation inside a bf16-out GEMM).
"""

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def dense(x: Float[Array, "..."], kernel: Float[Array, "..."], num_in_dims: int) -> Float[Array, "..."]:
    """x contracted with the kernel's first `num_in_dims` axes, in x's dtype."""
    in_shape, out_shape = kernel.shape[:num_in_dims], kernel.shape[num_in_dims:]
    lead = x.shape[: x.ndim - num_in_dims]
    x_MK = x.reshape(-1, math.prod(in_shape))
    w = kernel.reshape(math.prod(in_shape), *out_shape)
    return matmul(x_MK, w).reshape(*lead, *out_shape)


def matmul(x_MK: Float[Array, "M K"], w: Float[Array, "..."], w_axis: int = 0) -> Float[Array, "M ..."]:
    """x contracted with w's axis `w_axis` (K), in x's dtype: [M, w's other axes]. `w_axis` 1
    with a [V, D] w is x @ w.T, as a tied LM head reads its embedding. See the module's note
    on the CPU's 16-bit form."""
    dims = (((1,), (w_axis,)), ((), ()))
    if jax.default_backend() != "cpu" or jnp.dtype(x_MK.dtype).itemsize != 2:
        return jax.lax.dot_general(x_MK, w, dims)
    num_rows = x_MK.shape[0]
    if num_rows == 1:
        x_MK = jnp.concatenate([x_MK, x_MK])
    y = jax.lax.dot_general(x_MK, w, dims, preferred_element_type=jnp.float32).astype(x_MK.dtype)
    return y[:num_rows]
