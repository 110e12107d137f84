"""The KV write of one step: each token's new K/V rows into its slot of the paged cache.

Legend: T tokens, K kv heads, H head dim, P pages, S page size.

The write is one XLA scatter into the `[2, K, P, S, H]` cache at (page, offset) pairs. Under
`jit` with the cache donated, XLA updates it in place (no copy of the cache: the test
compiles the write and checks the optimized HLO). Scattering through a `[2, K, P * S, H]`
reshape instead made XLA copy the whole cache when K is 1 (one kv head per device). Padding
tokens carry slots inside block 0, the scratch block no request owns, so they need no mask;
they may collide there, and the scratch contents are unspecified. The scatter is declared
`unique_indices` (true of every real token's slot; the padding collisions land in scratch),
so XLA writes the rows with plain stores (H200, a 256-token step of Llama-3.1-8B shapes: 14 us a layer -> 3.8 us).
An fp8 cache stores k / k_scale and v / v_scale (kv_quant.py); the quantization fuses into
the scatter's operand.
"""

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from vjx.kernels.kv_quant import quantize


def write_kv_cache(
    kv_cache: Float[Array, "2 K P S H"],
    k: Float[Array, "T K H"],
    v: Float[Array, "T K H"],
    slot_mapping: Int[Array, " T"],
    k_scale: Float[Array, ""] | None = None,
    v_scale: Float[Array, ""] | None = None,
) -> Float[Array, "2 K P S H"]:
    """Scatters token t's k/v rows to slot `slot_mapping[t]` (block * S + offset); the scales
    apply to an fp8 cache only (None: 1.0)."""
    page_size = kv_cache.shape[3]
    rows = [quantize(x, scale, kv_cache.dtype) for x, scale in ((k, k_scale), (v, v_scale))]
    updates = jnp.stack(rows).swapaxes(1, 2)  # [2, K, T, H]
    return kv_cache.at[:, :, slot_mapping // page_size, slot_mapping % page_size].set(updates, unique_indices=True)
