"""Paged multi-head latent attention (DeepSeek-V2/V3) on the pure-jnp reference backend.

Legend: T tokens, N query heads, Lr the latent rank (`kv_lora_rank`), Lk = Lr +
`qk_rope_head_dim` the width of one token's latent (the absorbed form's key), P pages
(blocks), S page size.

The cache of one layer is one array `[P, S, Lk]`: token t's latent is its normed compressed
KV `c_kv` (Lr wide) followed by its rotary key part `k_pe`, shared by every head, so there is
no head axis and no separate value; flat slot `block_id * S + offset` addresses one token's
latent, as in reference.py.

Attention runs in the absorbed form. The model folds each head's W_UK into its query
(q_latent = [q_nope @ W_UK, q_pe], Lk wide) and applies W_UV to the output afterwards; here
head n's output is softmax_j(q_latent[n] . latent_j * sm_scale) . c_kv_j, i.e. one KV head
whose keys are the latents and whose values are their first Lr dims, read through
reference.py's chunked online softmax (causal, end-aligned, float32 statistics).
"""

from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import PagedKV, ReferenceBackend, Scoring
from vjx.kernels.kv_quant import quantize


def mla_kv_cache_shape(num_blocks: int, block_size: int, latent_dim: int) -> tuple[int, int, int]:
    """Shape of one MLA layer's cache: `latent_dim` (kv_lora_rank + qk_rope_head_dim) per slot."""
    return (num_blocks, block_size, latent_dim)


def write_latent(
    kv_cache: Float[Array, "P S Lk"], latent: Float[Array, "T Lk"], slot_mapping: Int[Array, " T"]
) -> Float[Array, "P S Lk"]:
    """Scatters each token's latent to its flat slot; padding tokens all land in block 0. An
    fp8 cache stores the latent saturated, unscaled (MLA layers carry no KV scale yet)."""
    num_blocks, block_size, latent_dim = kv_cache.shape
    flat = kv_cache.reshape(num_blocks * block_size, latent_dim)
    flat = flat.at[slot_mapping].set(quantize(latent, None, kv_cache.dtype))
    return flat.reshape(kv_cache.shape)


def mla_attention(
    q_latent: Float[Array, "T N Lk"],
    latent: Float[Array, "T Lk"],
    kv_cache: Float[Array, "P S Lk"],
    md: AttentionMetadata,
    *,
    sm_scale: float,
    kv_lora_rank: int,
) -> tuple[Float[Array, "T N Lr"], Float[Array, "P S Lk"]]:
    """Writes the step's latents at `md.slot_mapping`, then attends every token to its row's
    latents; returns the latent output (before W_UV) and the updated cache."""
    latent_dim = kv_cache.shape[-1]
    if not 0 < kv_lora_rank <= latent_dim:
        raise ValueError(f"kv_lora_rank must be in [1, {latent_dim}] (the cache's latent dim), got {kv_lora_rank}.")
    if q_latent.shape[-1] != latent_dim or latent.shape[-1] != latent_dim:
        raise ValueError(
            f"q_latent and latent must end in the cache's latent dim {latent_dim}, got shapes "
            f"{q_latent.shape} and {latent.shape}."
        )
    kv_cache = write_latent(kv_cache, latent, md.slot_mapping)
    paged_kv = _paged_latents(kv_cache, kv_lora_rank, q_latent.dtype)
    out = ReferenceBackend().attend(q_latent, paged_kv, md, Scoring(sm_scale, sliding_window=None, soft_cap=None))
    return out, kv_cache


def _paged_latents(kv_cache: Float[Array, "P S Lk"], kv_lora_rank: int, dtype: DTypeLike) -> PagedKV:
    """The latent cache as one KV head: keys are whole latents, values their first Lr dims."""
    _, block_size, latent_dim = kv_cache.shape

    def read_chunk(pages_TC):
        num_tokens, num_pages = pages_TC.shape
        k_TL1Lk = kv_cache[pages_TC].reshape(num_tokens, num_pages * block_size, 1, latent_dim).astype(dtype)
        return k_TL1Lk, k_TL1Lk[..., :kv_lora_rank]

    return PagedKV(read_chunk, block_size, num_kv_heads=1, value_dim=kv_lora_rank)
