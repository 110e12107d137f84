"""vjx's GPU KV cache layout and the TPU kernel's, each into the other (to compare the two)."""

import jax.numpy as jnp
from jaxtyping import Array, Float


def from_gpu_layout(kv_cache: Float[Array, "2 K P S H"]) -> Float[Array, "P S K2 H"]:
    """vjx's `[2, K, P, S, H]` GPU layout -> the TPU kernel's `[P, S, 2K, H]`."""
    _, num_kv_heads, num_pages, page_size, head_dim = kv_cache.shape
    pages = jnp.transpose(kv_cache, (2, 3, 1, 0, 4))  # [P, S, K, 2, H]
    return pages.reshape(num_pages, page_size, 2 * num_kv_heads, head_dim)


def to_gpu_layout(kv_pages: Float[Array, "P S K2 H"]) -> Float[Array, "2 K P S H"]:
    """The TPU kernel's `[P, S, 2K, H]` -> vjx's `[2, K, P, S, H]` GPU layout."""
    num_pages, page_size, num_combined, head_dim = kv_pages.shape
    pages = kv_pages.reshape(num_pages, page_size, num_combined // 2, 2, head_dim)
    return jnp.transpose(pages, (3, 2, 0, 1, 4))
