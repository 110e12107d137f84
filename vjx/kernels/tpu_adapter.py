"""Adapter to the TPU ragged paged attention kernel that ships with JAX.

Legend: T tokens, R rows, N query heads, K kv heads, H head dim, P pages, S page size.

That kernel's cache layout is `[P, S, 2K, H]`: the keys and values of kv head k are heads
2k and 2k + 1 of a page row. Its metadata is vjx's under other names (kv_lens = seq_lens,
page_indices = block_tables, cu_q_lens = query_start_loc), with the same end-aligned causal
mask, sliding window and soft cap. This module writes the step's K/V in that layout and calls
the kernel (or, off a TPU, JAX's own jnp reference of it, which takes
the same arguments).

Over an fp8 cache (kv_quant.py) the kernel converts each loaded K/V block to q's dtype, but it
takes its k_scale / v_scale as compile-time floats, and vjx's scales are arrays of the layer.
So the kernel gets 1.0 for both and the scales are applied outside it, to q (q . (s k) =
(s q) . k) and to the output (v_scale is a factor of every output row): two elementwise
products over [T, N, H], never over the cache.
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as tpu_kernel
from jaxtyping import Array, Float, Int

from vjx.kernels.kv_quant import is_quantized, quantize
from vjx.kernels.ragged_paged_attention import Scoring


def tpu_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    return (num_blocks, block_size, 2 * num_kv_heads, head_dim)


def write_kv_pages(
    kv_pages: Float[Array, "P S K2 H"],
    k: Float[Array, "T K H"],
    v: Float[Array, "T K H"],
    slot_mapping: Int[Array, " T"],
    k_scale: Float[Array, ""] | None = None,
    v_scale: Float[Array, ""] | None = None,
) -> Float[Array, "P S K2 H"]:
    """Scatters token t's interleaved k/v heads to flat slot `slot_mapping[t]`; the scales
    apply to an fp8 cache only (None: 1.0)."""
    num_pages, page_size, num_combined, head_dim = kv_pages.shape
    k, v = (quantize(x, scale, kv_pages.dtype) for x, scale in ((k, k_scale), (v, v_scale)))
    rows = jnp.stack([k, v], axis=2).reshape(k.shape[0], num_combined, head_dim)
    flat = kv_pages.reshape(num_pages * page_size, num_combined, head_dim)
    flat = flat.at[slot_mapping].set(rows)
    return flat.reshape(kv_pages.shape)


def tpu_ragged_paged_attention(
    q: Float[Array, "T N H"],
    kv_pages: Float[Array, "P S K2 H"],
    query_start_loc: Int[Array, " R1"],
    seq_lens: Int[Array, " R"],
    block_tables: Int[Array, "R W"],
    num_seqs: Int[Array, "1"],
    kv_scales: Float[Array, "2"] | None = None,
    *,
    scoring: Scoring,
    use_reference: bool = False,
) -> Float[Array, "T N H"]:
    """JAX's TPU kernel on vjx's metadata; padding tokens get 0. `kv_scales` ([k_scale,
    v_scale], float32) apply to an fp8 cache only; None means 1.0.

    `use_reference` runs JAX's jnp reference of the kernel instead (same arguments, any
    platform, eager only: it loops over `num_seqs` in Python).
    """
    attend = tpu_kernel.ref_ragged_paged_attention if use_reference else tpu_kernel.ragged_paged_attention
    is_fp8 = is_quantized(kv_pages.dtype)
    is_scaled = is_fp8 and kv_scales is not None
    if is_scaled:
        q = (q.astype(jnp.float32) * kv_scales[0]).astype(q.dtype)
    # A scale (1.0) makes the kernel convert the fp8 blocks it loads to q's dtype.
    unit_scale = 1.0 if is_fp8 else None
    out = attend(
        q,
        kv_pages,
        seq_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        sm_scale=scoring.sm_scale,
        sliding_window=scoring.sliding_window,
        soft_cap=scoring.soft_cap,
        k_scale=unit_scale,
        v_scale=unit_scale,
    )
    if is_scaled:
        out = out * kv_scales[1]
    # The jnp reference returns real tokens only; the kernel leaves padding tokens unspecified.
    out = jnp.pad(out, ((0, q.shape[0] - out.shape[0]), (0, 0), (0, 0)))
    is_real = jnp.arange(q.shape[0]) < query_start_loc[num_seqs[0]]
    return jnp.where(is_real[:, None, None], out, 0).astype(q.dtype)
