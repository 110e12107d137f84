"""The W4A16 matmul on GPUs in Pallas (Triton lowering): x times INT4 weights that are
dequantized tile by tile as the kernel reads them, never as a whole bf16 copy.

Legend: M rows of x (tokens), K inputs, N outputs, G groups of K, BM x BN the output tile of
one program, BK the inputs one step of its loop takes.

The weights are vjx's INT4 layout (vjx/quantization/int4.py): packed [K / 2, N] uint8 (input
row 2i in the low nibble, 2i + 1 in the high one), scales [G, N] and zero points [G, N] uint8
(None: symmetric, every zero point 8). The wrapper splits x into its even and odd input
columns ([M, K / 2] each: activations are small next to the weights), so a packed tile
[BK / 2, BN] enters two dots, the even columns against the low nibbles and the odd ones
against the high nibbles, each nibble dequantized as (q - zero) * scale in the activations'
dtype; the dots accumulate in float32. BK divides the group size, so a step reads one row of
scales and zero points. Program (i, j) owns output tile (i, j); its loop walks all of K.

The tile sizes must divide the shapes (no masked loads): BN and BK are powers of two dividing
N and the group size; `kernel_fits` says whether a layer's shapes allow it, and the caller
takes the jnp path otherwise. Rows of x are padded to a multiple of BM.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, UInt8

SYMMETRIC_ZERO = 8
"""The zero point of symmetric 4-bit weights, stored unsigned (value + 8)."""
MAX_BLOCK_N = 128
MAX_BLOCK_K = 128
MIN_DOT = 16
"""Triton's smallest dot dimension: BM, BN and BK / 2 are at least this."""


def tile_sizes(num_rows: int, num_out: int, group_size: int) -> tuple[int, int, int]:
    """(BM, BN, BK) for M rows, N outputs and groups of `group_size` inputs: BN and BK the
    largest powers of two dividing N and the group size (n & -n), capped."""
    block_m = MIN_DOT if num_rows <= MIN_DOT else 64
    return block_m, min(num_out & -num_out, MAX_BLOCK_N), min(group_size & -group_size, MAX_BLOCK_K)


def kernel_fits(num_in: int, num_out: int, group_size: int) -> bool:
    """Whether the kernel's tiles divide these shapes (else the caller uses jnp)."""
    _, block_n, block_k = tile_sizes(1, num_out, group_size)
    return num_in % group_size == 0 and block_n >= MIN_DOT and block_k // 2 >= MIN_DOT


def _kernel(
    x_even_ref,
    x_odd_ref,
    packed_ref,
    scale_ref,
    *rest,
    block_m: int,
    block_n: int,
    block_k: int,
    group_size: int,
    num_steps: int,
):
    *zero_ref, out_ref = rest
    rows = pl.ds(pl.program_id(0) * block_m, block_m)
    cols = pl.ds(pl.program_id(1) * block_n, block_n)
    half = block_k // 2
    dtype = x_even_ref.dtype

    def step(s, acc):
        inputs = pl.ds(s * half, half)
        group = (s * block_k) // group_size
        scale = scale_ref[pl.ds(group, 1), cols].astype(jnp.float32)
        zero = zero_ref[0][pl.ds(group, 1), cols].astype(jnp.float32) if zero_ref else SYMMETRIC_ZERO
        packed = packed_ref[inputs, cols]
        low = (((packed & 0xF).astype(jnp.float32) - zero) * scale).astype(dtype)
        high = (((packed >> 4).astype(jnp.float32) - zero) * scale).astype(dtype)
        acc += jnp.dot(x_even_ref[rows, inputs], low, preferred_element_type=jnp.float32)
        return acc + jnp.dot(x_odd_ref[rows, inputs], high, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, num_steps, step, jnp.zeros((block_m, block_n), jnp.float32))
    out_ref[rows, cols] = acc.astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("group_size", "interpret"))
def int4_matmul(
    x: Float[Array, "M K"],
    packed: UInt8[Array, "K/2 N"],
    scale: Float[Array, "G N"],
    zero: UInt8[Array, "G N"] | None,
    *,
    group_size: int,
    interpret: bool = False,
) -> Float[Array, "M N"]:
    """x @ dequantize(packed, scale, zero) in x's dtype; the shapes must satisfy `kernel_fits`."""
    (num_rows, num_in), num_out = x.shape, packed.shape[1]
    if not kernel_fits(num_in, num_out, group_size):
        raise ValueError(f"the INT4 kernel's tiles do not divide K={num_in}, N={num_out}, group size {group_size}.")
    block_m, block_n, block_k = tile_sizes(num_rows, num_out, group_size)
    padded = pl.cdiv(num_rows, block_m) * block_m
    x = jnp.pad(x, ((0, padded - num_rows), (0, 0)))
    operands = [x[:, 0::2], x[:, 1::2], packed, scale.astype(x.dtype)] + ([] if zero is None else [zero])
    kernel = functools.partial(
        _kernel,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        group_size=group_size,
        num_steps=num_in // block_k,
    )
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((padded, num_out), x.dtype),
        grid=(padded // block_m, num_out // block_n),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="int4_matmul",
    )(*operands)
    return out[:num_rows]
