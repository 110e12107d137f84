"""Each layer's cache array, by its spec: the attention backend's layout for per-head keys
and values, or MLA's latent layout (vjx/attention/mla.py), which has no head axis and is
whole on every device (each device's heads read every latent)."""

from vjx.attention.backend import AttentionBackend
from vjx.attention.mla import mla_kv_cache_shape
from vjx.kv_cache_interface import AttentionSpec, KVCacheSpec, MLAAttentionSpec

MLA_KV_CACHE_AXES = (None, None, None)


def kv_cache_shape(backend: AttentionBackend, spec: KVCacheSpec, num_blocks: int) -> tuple[int, ...]:
    """The shape of one layer's cache of `num_blocks` blocks."""
    if isinstance(spec, MLAAttentionSpec):
        return mla_kv_cache_shape(num_blocks, spec.block_size, spec.latent_dim)
    assert isinstance(spec, AttentionSpec)
    return backend.kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)


def kv_cache_axes(backend: AttentionBackend, spec: KVCacheSpec) -> tuple[str | None, ...]:
    """The logical axes of one layer's cache array."""
    return MLA_KV_CACHE_AXES if isinstance(spec, MLAAttentionSpec) else backend.kv_cache_axes
