"""The attention backend interface and the registry that picks one by name or platform."""

from typing import Protocol, runtime_checkable

import jax
from jaxtyping import Array, Float

from vjx.attention.metadata import AttentionMetadata
from vjx.config import CPU_MAX_NUM_BATCHED_TOKENS


@runtime_checkable
class AttentionBackend(Protocol):
    """Writes a step's K/V into the paged cache and attends every query token.

    Attention is causal, aligned to the END of each sequence: query i of a row with q_len
    query tokens and seq_len keys sees keys < seq_len - q_len + i + 1.

    The cache's dtype is the model's, or float8_e4m3fn for `kv_cache_dtype="fp8"`: then the
    write stores k / k_scale and v / v_scale (saturated at +-448), and attention reads the fp8
    blocks back inside its kernel, converted to q's dtype and scaled (vjx/kernels/kv_quant.py).
    The scales are the attention layer's float32 scalars (None: 1.0); a cache of the model
    dtype ignores them, as vLLM's does.

    `sinks` (gpt-oss's attention sinks; float32, one per query head, None: none) add a logit
    with no value to each head's softmax, after soft-capping and masking: head n's output is
    sum_j exp(s_j) v_j / (exp(sinks[n]) + sum_j exp(s_j)), so a query may attend to nothing.
    """

    name: str
    kv_cache_axes: tuple[str | None, ...]
    """Logical axis name of each dimension of `kv_cache_shape` (the KV heads: `kv_heads`),
    which the sharding table maps to the mesh."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's cache array; the layout is the backend's own."""
        ...

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
        """Returns the attention output and the updated cache."""
        ...


_PLATFORM_DEFAULTS = {"gpu": "pallas_gpu", "tpu": "pallas_tpu", "cpu": "cpu"}


def _backends() -> dict[str, type]:
    from vjx.attention.cpu import CpuBackend
    from vjx.attention.pallas_gpu import PallasGpuBackend, PallasGpuMosaicBackend
    from vjx.attention.pallas_tpu import PallasTpuBackend
    from vjx.attention.reference import ReferenceBackend

    backends = (ReferenceBackend, CpuBackend, PallasGpuBackend, PallasGpuMosaicBackend, PallasTpuBackend)
    return {b.name: b for b in backends}


def default_backend_name(max_num_batched_tokens: int | None = None) -> str:
    """The platform's backend: Pallas kernels on GPU and TPU; on the CPU the blocked jnp
    backend at serving budgets (`max_num_batched_tokens` >= 512, the CPU's default, or None),
    the reference below them: no step of theirs holds a long prefill chunk, and the CPU
    backend's two paths cost twice the reference's compile time (0.7 s more a compiled step
    for a 4-layer model, 2.4 s for SmolLM2's 30 layers)."""
    name = _PLATFORM_DEFAULTS.get(jax.default_backend(), "reference")
    if name == "cpu" and max_num_batched_tokens is not None and max_num_batched_tokens < CPU_MAX_NUM_BATCHED_TOKENS:
        return "reference"
    return name


def get_attention_backend(name: str | None) -> AttentionBackend:
    """The backend called `name`; None means the platform's default."""
    backends = _backends()
    name = name or default_backend_name()
    if name not in backends:
        raise ValueError(f"attention_backend must be one of {sorted(backends)}, got {name!r}.")
    return backends[name]()
