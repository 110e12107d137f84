"""Attention under tensor parallelism: any backend, run per device on that device's heads.

Legend: T tokens, N query heads, K kv heads, H head dim.

The projections leave q sharded over query heads and k/v over KV heads on the `model` mesh
axis, and the KV cache is sharded over KV heads the same way (each backend names its cache
dimensions in `kv_cache_axes`). With N / K query heads per KV head, the heads of a device
form whole GQA groups, so attention needs no communication: `shard_map` hands each device its
q[T, N/tp, H], k/v[T, K/tp, H] and cache shard, and the backend (a Pallas kernel or the jnp
reference) runs unchanged on them, with the attention sinks of its query heads (split like
q's heads). The step metadata and the fp8 cache's k/v scales are replicated.
"""

import dataclasses

import jax
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float

from vjx.attention.backend import AttentionBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.sharding.constraints import mesh_spec


@dataclasses.dataclass(frozen=True)
class ShardedBackend:
    """Wraps `backend` in a `shard_map` over the trace's mesh (the one `jax.set_mesh` gave);
    without a mesh, or with one device on `model`, it calls `backend` directly. Hashable, so a
    model can hold it as a static field."""

    backend: AttentionBackend

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def kv_cache_axes(self) -> tuple[str | None, ...]:
        return self.backend.kv_cache_axes

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return self.backend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)

    def forward(
        self,
        q: Float[Array, "T N H"],
        k: Float[Array, "T K H"],
        v: Float[Array, "T K H"],
        kv_cache: Array,
        md: AttentionMetadata,
        *,
        sm_scale: float,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
        k_scale: Float[Array, ""] | None = None,
        v_scale: Float[Array, ""] | None = None,
        sinks: Float[Array, " N"] | None = None,
    ) -> tuple[Float[Array, "T N H"], Array]:
        """The backend's `forward`, one call per device on its heads and cache shard."""
        scoring = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)

        def forward(q, k, v, kv_cache, md, scales, sinks):
            return self.backend.forward(
                q, k, v, kv_cache, md, **scoring, k_scale=scales[0], v_scale=scales[1], sinks=sinks
            )

        scales = (k_scale, v_scale)
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty or mesh.shape.get("model", 1) == 1:
            return forward(q, k, v, kv_cache, md, scales, sinks)
        heads = mesh_spec(mesh, ("tokens", "heads", "head_dim"))
        kv_heads = mesh_spec(mesh, ("tokens", "kv_heads", "head_dim"))
        cache = mesh_spec(mesh, self.backend.kv_cache_axes)
        head_sinks = mesh_spec(mesh, ("heads",))
        # The kernels are per-device programs; they carry no replication annotations to check.
        sharded = jax.shard_map(
            forward,
            mesh=mesh,
            in_specs=(heads, kv_heads, kv_heads, cache, PartitionSpec(), PartitionSpec(), head_sinks),
            out_specs=(heads, cache),
            check_vma=False,
        )
        return sharded(q, k, v, kv_cache, md, scales, sinks)
