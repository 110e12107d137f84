"""The Pallas GPU attention backend: vjx's own ragged paged attention kernels.

Legend: T tokens, N query heads, K kv heads, H head dim, P pages, S page size.

Its cache layout is `[2, K, P, S, H]` (index 0 keys, 1 values; one kv head's page is
contiguous), unlike the reference's `[2, P, S, K, H]`. Off a GPU the kernels run in Pallas
interpret mode, which is how CI tests them. An fp8 cache is quantized by the write and read
back inside the attention kernel (vjx/kernels/kv_quant.py).

Which kernel runs the rows with several query tokens (`prefill_kernel`):
- "triton" (default): the Triton-lowered launch of vjx/kernels/ragged_paged_attention.py;
- "mosaic" (Hopper GPUs, opt-in while it is validated): the Mosaic GPU kernel
  (vjx/kernels/paged_prefill_mgpu.py: TMA, wgmma, warp specialisation) for steps of 16-bit q
  and cache, head dim 64 or 128, no sliding window, soft cap or sinks, and a multiple of 8
  tokens, at least 128; any other step keeps the Triton launch. Off a Hopper GPU it falls back to "triton".
Decode rows always run in the Triton decode launch.
"""

import dataclasses
from typing import ClassVar

import jax
from jaxtyping import Array, Float

from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.kv_cache_write import write_kv_cache
from vjx.kernels.kv_quant import kv_scales
from vjx.kernels.paged_prefill_mgpu import MosaicPrefillTuning
from vjx.kernels.ragged_paged_attention import Scoring, ragged_paged_attention
from vjx.kernels.tuning import AttentionTuning

_PREFILL_KERNELS = ("triton", "mosaic")


def _is_hopper() -> bool:
    """Whether the default device is a Hopper GPU (compute capability 9.0)."""
    device = jax.devices()[0]
    return device.platform == "gpu" and getattr(device, "compute_capability", "") == "9.0"


@dataclasses.dataclass(frozen=True)
class PallasGpuBackend:
    """Hashable, so a model can hold it as a static field."""

    name: ClassVar[str] = "pallas_gpu"
    kv_cache_axes: ClassVar[tuple[str | None, ...]] = (None, "kv_heads", None, None, "head_dim")
    tuning: AttentionTuning | None = None
    """Kernel knobs; None takes the per-head-dim defaults of vjx/kernels/tuning.py."""
    interpret: bool | None = None
    """Run the kernels in Pallas interpret mode; None means "unless the default device is a GPU"."""
    prefill_kernel: str = "triton"
    """"triton" or "mosaic": see the module docstring."""
    mosaic_tuning: MosaicPrefillTuning = MosaicPrefillTuning()

    def __post_init__(self):
        if self.prefill_kernel not in _PREFILL_KERNELS:
            raise ValueError(f"prefill_kernel must be one of {_PREFILL_KERNELS}, got {self.prefill_kernel!r}.")

    def mosaic_prefill(self) -> MosaicPrefillTuning | None:
        """The Mosaic GPU prefill kernel's tuning where it is chosen, else None."""
        if self.prefill_kernel == "mosaic" and (_is_hopper() or self.interpret):
            return self.mosaic_tuning
        return None

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_kv_heads, num_blocks, block_size, head_dim)

    def forward(
        self,
        q: Float[Array, "T N H"],
        k: Float[Array, "T K H"],
        v: Float[Array, "T K H"],
        kv_cache: Float[Array, "2 K P S H"],
        md: AttentionMetadata,
        *,
        sm_scale: float,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
        k_scale: Float[Array, ""] | None = None,
        v_scale: Float[Array, ""] | None = None,
        sinks: Float[Array, " N"] | None = None,
    ) -> tuple[Float[Array, "T N H"], Float[Array, "2 K P S H"]]:
        """Writes k/v at `md.slot_mapping`, then attends every token to its row's keys."""
        scoring = Scoring(sm_scale, sliding_window, soft_cap)
        kv_cache = write_kv_cache(kv_cache, k, v, md.slot_mapping, k_scale, v_scale)
        interpret = self.interpret
        if interpret is None:
            interpret = jax.default_backend() != "gpu"
        out = ragged_paged_attention(
            q,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_tables,
            md.num_seqs,
            kv_scales(k_scale, v_scale),
            sinks,
            scoring=scoring,
            tuning=self.tuning,
            mosaic_prefill=self.mosaic_prefill(),
            interpret=interpret,
        )
        return out, kv_cache


@dataclasses.dataclass(frozen=True)
class PallasGpuMosaicBackend(PallasGpuBackend):
    """`pallas_gpu` with the Mosaic GPU prefill kernel (`attention_backend="pallas_gpu_mosaic"`)."""

    name: ClassVar[str] = "pallas_gpu_mosaic"
    prefill_kernel: str = "mosaic"
