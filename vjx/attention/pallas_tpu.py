"""The Pallas TPU attention backend: an adapter to the ragged paged attention kernel that
ships with JAX (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`).

Legend: T tokens, N query heads, K kv heads, H head dim, P pages, S page size.

Its cache layout is the kernel's own, `[P, S, 2K, H]` (keys and values of a kv head
interleaved); `vjx.kernels.tpu_adapter` converts to and from the GPU layout. That kernel has
no attention sinks, so this backend refuses them.
"""

import dataclasses
from typing import ClassVar

from jaxtyping import Array, Float

from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.kv_quant import kv_scales
from vjx.kernels.ragged_paged_attention import Scoring
from vjx.kernels.tpu_adapter import tpu_kv_cache_shape, tpu_ragged_paged_attention, write_kv_pages


@dataclasses.dataclass(frozen=True)
class PallasTpuBackend:
    """Hashable, so a model can hold it as a static field."""

    name: ClassVar[str] = "pallas_tpu"
    kv_cache_axes: ClassVar[tuple[str | None, ...]] = (None, None, "kv_heads", "head_dim")
    """Keys and values of a KV head sit side by side on the third axis, so a split of it into
    equal parts gives each device whole heads."""
    use_reference: bool = False
    """Run JAX's jnp reference of the TPU kernel (any platform, eager only) instead of the
    kernel: how CPU tests check the adapter's layout and argument mapping."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return tpu_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)

    def forward(
        self,
        q: Float[Array, "T N H"],
        k: Float[Array, "T K H"],
        v: Float[Array, "T K H"],
        kv_cache: Float[Array, "P S K2 H"],
        md: AttentionMetadata,
        *,
        sm_scale: float,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
        k_scale: Float[Array, ""] | None = None,
        v_scale: Float[Array, ""] | None = None,
        sinks: Float[Array, " N"] | None = None,
    ) -> tuple[Float[Array, "T N H"], Float[Array, "P S K2 H"]]:
        """Writes k/v at `md.slot_mapping`, then attends every token to its row's keys."""
        if sinks is not None:
            raise ValueError(
                "sinks (attention sinks) must be None on the pallas_tpu backend: JAX's TPU ragged paged "
                "attention kernel takes none. Use attention_backend='reference' for such a model."
            )
        scoring = Scoring(sm_scale, sliding_window, soft_cap)
        kv_cache = write_kv_pages(kv_cache, k, v, md.slot_mapping, k_scale, v_scale)
        out = tpu_ragged_paged_attention(
            q,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_tables,
            md.num_seqs,
            kv_scales(k_scale, v_scale),
            scoring=scoring,
            use_reference=self.use_reference,
        )
        return out, kv_cache
