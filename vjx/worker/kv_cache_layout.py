"""Each layer's cache array, by its spec: the attention backend's layout for per-head keys
and values; MLA's latent layout (vjx/attention/mla.py), which has no head axis and is whole
on every device (each device's heads read every latent); or a Mamba layer's state slots, one
row of its flattened states per slot (vjx/models/layers/mamba_mixer.py), also whole on every
device."""

from vjx.attention.backend import AttentionBackend
from vjx.attention.mla import mla_kv_cache_shape
from vjx.kv_cache_interface import AttentionSpec, KVCacheSpec, MambaSpec, MLAAttentionSpec

MLA_KV_CACHE_AXES = (None, None, None)
MAMBA_STATE_AXES = (None, None)


def kv_cache_shape(
    backend: AttentionBackend, spec: KVCacheSpec, num_blocks: int, *, num_state_slots: int
) -> tuple[int, ...]:
    """The shape of one layer's cache of `num_blocks` blocks (`num_state_slots` slots for a
    state-space layer, whose slots are a pool of their own)."""
    if isinstance(spec, MLAAttentionSpec):
        return mla_kv_cache_shape(num_blocks, spec.block_size, spec.latent_dim)
    if isinstance(spec, MambaSpec):
        return (num_state_slots, spec.state_size)
    assert isinstance(spec, AttentionSpec)
    return backend.kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)


def kv_cache_axes(backend: AttentionBackend, spec: KVCacheSpec) -> tuple[str | None, ...]:
    """The logical axes of one layer's cache array."""
    if isinstance(spec, MLAAttentionSpec):
        return MLA_KV_CACHE_AXES
    if isinstance(spec, MambaSpec):
        return MAMBA_STATE_AXES
    return backend.kv_cache_axes
