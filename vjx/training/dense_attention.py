"""DenseAttentionBackend: causal attention among one step's own tokens, dense and
differentiable, for a learner's forward pass (no paged cache: every sequence is whole in the
step).

The engine's backends walk the paged cache with loops whose length depends on the data, which
reverse-mode autodiff cannot go through; this one is a masked [T, T] softmax per head, so
memory grows with the square of the step's tokens (a learner's batch of short rollouts).
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from vjx.attention.metadata import AttentionMetadata

_MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class DenseAttentionBackend:
    """Each token attends to the tokens before it in its own row (rows laid out one after
    another by `md.query_start_loc`); the cache is neither read nor written."""

    name: ClassVar[str] = "dense"
    kv_cache_axes: ClassVar[tuple[str | None, ...]] = (None,)

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (0,)

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
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        q_TKGH = q.reshape(num_tokens, num_kv_heads, num_heads // num_kv_heads, head_dim)
        logits = jnp.einsum("tkgh,skh->kgts", q_TKGH, k, preferred_element_type=jnp.float32) * sm_scale
        if soft_cap is not None:
            logits = soft_cap * jnp.tanh(logits / soft_cap)
        logits = jnp.where(_visible(md, num_tokens, sliding_window), logits, _MASK_VALUE)
        if sinks is not None:
            sink_KG = sinks.astype(jnp.float32).reshape(num_kv_heads, -1)
            sink = jnp.broadcast_to(sink_KG[:, :, None, None], (*logits.shape[:3], 1))
            weights = jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]
        else:
            weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("kgts,skh->tkgh", weights.astype(v.dtype), v)
        return out.reshape(num_tokens, num_heads, head_dim), kv_cache


def _visible(md: AttentionMetadata, num_tokens: int, sliding_window: int | None) -> jax.Array:
    """[T, T]: whether query t sees key s (same row, not after it, within the window)."""
    index = jnp.arange(num_tokens)
    row = jnp.searchsorted(md.query_start_loc, index, side="right") - 1
    visible = (row[:, None] == row[None, :]) & (index[None, :] <= index[:, None])
    if sliding_window is not None:
        visible &= index[:, None] - index[None, :] < sliding_window
    return visible
