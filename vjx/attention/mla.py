"""Paged multi-head latent attention (DeepSeek-V2/V3) on the pure-jnp reference backend.

Legend: T tokens, N query heads, R the latent rank (`kv_lora_rank`), E the rotary dim
(`qk_rope_head_dim`), P the per-head key dim without rotary part (`qk_nope_head_dim`), V the
value dim, Lk = R + E the width of one token's latent, S page size.

The cache of one layer is one array `[pages, S, Lk]`: token t's latent is its normed
compressed KV `c_kv` (R wide) followed by its rotary key part `k_pe`, shared by every head,
so there is no head axis and no separate value; flat slot `block_id * S + offset` addresses
one token's latent, as in reference.py. `kv_b_proj`'s kernel [R, N, P + V] holds the two
up-projections: W_UK (c_kv -> each head's key without rotary part) and W_UV (c_kv -> value).

Attention takes two forms of the same product, as vLLM's MLA backends do:
- absorbed (decode): W_UK is folded into each query (q_latent = [q_nope W_UK, q_pe], Lk wide)
  and W_UV applied to the output, so head n's output is softmax_j(q_latent[n] . latent_j)
  . c_kv_j W_UV: one KV head whose keys are the cached latents and whose values are their
  first R dims. It reads Lk values a key and no per-head expansion: the cheap form when a
  query is one token and its keys are many.
- expanded (prefill): the step's own latents are expanded to per-head keys [c_kv W_UK, k_pe]
  (P + E) and values c_kv W_UV (V), and its tokens attend to them causally in that form, which
  costs (P + E + V) a query-key pair instead of (Lk + R); a row's context (the tokens cached
  before the step: an earlier chunk, a prefix-cache hit) is read in the absorbed form and the
  two softmaxes are merged by their log-sum-exp. vLLM also expands the context, in chunks of a
  workspace; here it stays absorbed, so the cache is read one way only.
A step whose rows all have one query token (pure decode) runs the absorbed form; any other
step the expanded one (its decode rows too: their context is absorbed, their own key expanded).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata, is_decode_only
from vjx.attention.reference import PagedKV, ReferenceBackend, Scoring
from vjx.kernels.kv_quant import quantize


class UpProjection(NamedTuple):
    """`kv_b_proj`'s kernel as the two up-projections of the latent."""

    w_uk: Float[Array, "R N P"]
    w_uv: Float[Array, "R N V"]


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
    q: Float[Array, "T N PE"],
    latent: Float[Array, "T Lk"],
    kv_cache: Float[Array, "pages S Lk"],
    md: AttentionMetadata,
    up: UpProjection,
    *,
    sm_scale: float,
) -> tuple[Float[Array, "T N V"], Float[Array, "pages S Lk"]]:
    """Writes the step's latents at `md.slot_mapping`, then attends every token to its row's
    keys, absorbed for a pure-decode step and expanded otherwise; returns each head's output
    (V wide, before `o_proj`) and the updated cache. `q` is [q_nope, q_pe] per head, `latent`
    [c_kv, k_pe] per token, both with the rotation applied."""
    _check_shapes(q, latent, kv_cache, up)
    kv_cache = write_latent(kv_cache, latent, md.slot_mapping)
    out = jax.lax.cond(
        is_decode_only(md),
        lambda: absorbed_attention(q, kv_cache, md, up, sm_scale=sm_scale),
        lambda: expanded_attention(q, latent, kv_cache, md, up, sm_scale=sm_scale),
    )
    return out, kv_cache


def absorbed_attention(
    q: Float[Array, "T N PE"],
    kv_cache: Float[Array, "pages S Lk"],
    md: AttentionMetadata,
    up: UpProjection,
    *,
    sm_scale: float,
) -> Float[Array, "T N V"]:
    """Every token against all its row's latents (already written), in the absorbed form."""
    q_latent = _absorbed_query(q, up)
    out_TNR = latent_attention(q_latent, kv_cache, md, sm_scale=sm_scale, kv_lora_rank=up.w_uk.shape[0])
    return jnp.einsum("tnr,rnv->tnv", out_TNR, up.w_uv)


def latent_attention(
    q_latent: Float[Array, "T N Lk"],
    kv_cache: Float[Array, "pages S Lk"],
    md: AttentionMetadata,
    *,
    sm_scale: float,
    kv_lora_rank: int,
) -> Float[Array, "T N R"]:
    """The absorbed form's attention proper, in the latent space (what the Pallas kernel
    vjx/kernels/mla_paged_attention.py computes): one KV head whose keys are the cached
    latents and whose values are their first `kv_lora_rank` dims."""
    paged = _paged_latents(kv_cache, kv_lora_rank, q_latent.dtype)
    return ReferenceBackend().attend(q_latent, paged, md, _scoring(sm_scale))


def expanded_attention(
    q: Float[Array, "T N PE"],
    latent: Float[Array, "T Lk"],
    kv_cache: Float[Array, "pages S Lk"],
    md: AttentionMetadata,
    up: UpProjection,
    *,
    sm_scale: float,
) -> Float[Array, "T N V"]:
    """Every token against its row's context in the absorbed form (cache already written)
    and against the step's own tokens of its row expanded to per-head keys and values, the
    two merged by their log-sum-exp."""
    backend, scoring = ReferenceBackend(), _scoring(sm_scale)
    paged = _paged_latents(kv_cache, up.w_uk.shape[0], q.dtype)
    context_TNR, context_lse = backend.attend_context(_absorbed_query(q, up), paged, md, scoring)
    context_TNV = jnp.einsum("tnr,rnv->tnv", context_TNR, up.w_uv)
    rank, num_heads = up.w_uk.shape[:2]
    c_kv_TR, k_pe_TE = latent[:, :rank], latent[:, rank:]
    k_nope_TNP = jnp.einsum("tr,rnp->tnp", c_kv_TR, up.w_uk)
    k_pe_TNE = jnp.broadcast_to(k_pe_TE[:, None], (latent.shape[0], num_heads, k_pe_TE.shape[-1]))
    k_TNH = jnp.concatenate([k_nope_TNP, k_pe_TNE.astype(k_nope_TNP.dtype)], axis=-1)
    v_TNV = jnp.einsum("tr,rnv->tnv", c_kv_TR, up.w_uv)
    step_TNV, step_lse = backend.attend_step(q, k_TNH, v_TNV, md, scoring)
    return merge_attention_states(context_TNV, context_lse, step_TNV, step_lse)


def merge_attention_states(
    out_a: Float[Array, "T N V"], lse_a: Float[Array, "T N"], out_b: Float[Array, "T N V"], lse_b: Float[Array, "T N"]
) -> Float[Array, "T N V"]:
    """One softmax's output from two over disjoint key sets, weighted by their sums (a part
    that saw no key has lse -inf and weight 0; if neither saw one the output is 0)."""
    lse_max = jnp.maximum(lse_a, lse_b)
    safe_max = jnp.where(jnp.isfinite(lse_max), lse_max, 0.0)
    w_a, w_b = jnp.exp(lse_a - safe_max), jnp.exp(lse_b - safe_max)
    total = jnp.where(w_a + w_b > 0, w_a + w_b, 1.0)
    out = (w_a / total)[..., None] * out_a.astype(jnp.float32) + (w_b / total)[..., None] * out_b.astype(jnp.float32)
    return out.astype(out_a.dtype)


def _check_shapes(q: Array, latent: Array, kv_cache: Array, up: UpProjection) -> None:
    rank, num_heads, nope_dim = up.w_uk.shape
    latent_dim = kv_cache.shape[-1]
    rope_dim = latent_dim - rank
    if not 0 < rank <= latent_dim:
        raise ValueError(f"kv_lora_rank must be in [1, {latent_dim}] (the cache's latent dim), got {rank}.")
    if latent.shape[-1] != latent_dim or q.shape[1:] != (num_heads, nope_dim + rope_dim):
        raise ValueError(
            f"q must be [T, {num_heads}, {nope_dim + rope_dim}] and latent [T, {latent_dim}] for this cache "
            f"and kv_b_proj, got shapes {q.shape} and {latent.shape}."
        )


def _scoring(sm_scale: float) -> Scoring:
    return Scoring(sm_scale, sliding_window=None, soft_cap=None)


def _absorbed_query(q: Float[Array, "T N PE"], up: UpProjection) -> Float[Array, "T N Lk"]:
    """[q_nope W_UK^T, q_pe]: each head's query in the latent space."""
    nope_dim = up.w_uk.shape[-1]
    q_latent_TNR = jnp.einsum("tnp,rnp->tnr", q[..., :nope_dim], up.w_uk)
    return jnp.concatenate([q_latent_TNR, q[..., nope_dim:].astype(q_latent_TNR.dtype)], axis=-1)


def _paged_latents(kv_cache: Float[Array, "pages S Lk"], kv_lora_rank: int, dtype: DTypeLike) -> PagedKV:
    """The latent cache as one KV head: keys are whole latents, values their first R dims."""
    _, block_size, latent_dim = kv_cache.shape

    def read_chunk(pages_TC):
        num_tokens, num_pages = pages_TC.shape
        k_TL1Lk = kv_cache[pages_TC].reshape(num_tokens, num_pages * block_size, 1, latent_dim).astype(dtype)
        return k_TL1Lk, k_TL1Lk[..., :kv_lora_rank]

    return PagedKV(read_chunk, block_size, num_kv_heads=1, value_dim=kv_lora_rank)
