"""The KV write of one step: each token's new K/V rows into its slot of the paged cache.

Legend: T tokens, K kv heads, H head dim, P pages, S page size.

The write is one XLA scatter on the `[2, K, P, S, H]` cache seen as `[2, K, P * S, H]`.
Under `jit` with the cache donated, XLA updates it in place (no copy of the cache: the test
compiles the write and checks the optimized HLO). Padding tokens carry slots inside block 0,
the scratch block no request owns, so they need no mask; they may collide there, and the
scratch contents are unspecified.
"""

import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def write_kv_cache(
    kv_cache: Float[Array, "2 K P S H"],
    k: Float[Array, "T K H"],
    v: Float[Array, "T K H"],
    slot_mapping: Int[Array, "T"],
) -> Float[Array, "2 K P S H"]:
    """Scatters token t's k/v rows to flat slot `slot_mapping[t]` (block * S + offset)."""
    _, num_kv_heads, num_pages, page_size, head_dim = kv_cache.shape
    flat = kv_cache.reshape(2, num_kv_heads, num_pages * page_size, head_dim)
    updates = jnp.stack([k, v]).swapaxes(1, 2).astype(kv_cache.dtype)  # [2, K, T, H]
    flat = flat.at[:, :, slot_mapping].set(updates)
    return flat.reshape(kv_cache.shape)
