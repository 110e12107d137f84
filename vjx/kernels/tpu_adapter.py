"""Adapter to the TPU ragged paged attention kernel that ships with JAX.

Legend: T tokens, R rows, N query heads, K kv heads, H head dim, P pages, S page size.

That kernel's cache layout is `[P, S, 2K, H]`: the keys and values of kv head k are heads
2k and 2k + 1 of a page row. Its metadata is vjx's under other names (kv_lens = seq_lens,
page_indices = block_tables, cu_q_lens = query_start_loc), with the same end-aligned causal
mask, sliding window and soft cap. This module writes the step's K/V in that layout and calls
the kernel (or, off a TPU, JAX's own jnp reference of it, which takes
the same arguments).
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as tpu_kernel
from jaxtyping import Array, Float, Int

from vjx.kernels.ragged_paged_attention import Scoring


def tpu_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    return (num_blocks, block_size, 2 * num_kv_heads, head_dim)


def write_kv_pages(
    kv_pages: Float[Array, "P S K2 H"],
    k: Float[Array, "T K H"],
    v: Float[Array, "T K H"],
    slot_mapping: Int[Array, " T"],
) -> Float[Array, "P S K2 H"]:
    """Scatters token t's interleaved k/v heads to flat slot `slot_mapping[t]`."""
    num_pages, page_size, num_combined, head_dim = kv_pages.shape
    rows = jnp.stack([k, v], axis=2).reshape(k.shape[0], num_combined, head_dim)
    flat = kv_pages.reshape(num_pages * page_size, num_combined, head_dim)
    flat = flat.at[slot_mapping].set(rows.astype(kv_pages.dtype))
    return flat.reshape(kv_pages.shape)


def tpu_ragged_paged_attention(
    q: Float[Array, "T N H"],
    kv_pages: Float[Array, "P S K2 H"],
    query_start_loc: Int[Array, " R1"],
    seq_lens: Int[Array, " R"],
    block_tables: Int[Array, "R W"],
    num_seqs: Int[Array, "1"],
    *,
    scoring: Scoring,
    use_reference: bool = False,
) -> Float[Array, "T N H"]:
    """JAX's TPU kernel on vjx's metadata; padding tokens get 0.

    `use_reference` runs JAX's jnp reference of the kernel instead (same arguments, any
    platform, eager only: it loops over `num_seqs` in Python).
    """
    attend = tpu_kernel.ref_ragged_paged_attention if use_reference else tpu_kernel.ragged_paged_attention
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
    )
    # The jnp reference returns real tokens only; the kernel leaves padding tokens unspecified.
    out = jnp.pad(out, ((0, q.shape[0] - out.shape[0]), (0, 0), (0, 0)))
    is_real = jnp.arange(q.shape[0]) < query_start_loc[num_seqs[0]]
    return jnp.where(is_real[:, None, None], out, 0).astype(q.dtype)
