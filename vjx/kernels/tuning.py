"""Tuning knobs of the ragged paged attention kernels, with per-shape defaults.

A `KernelTuning` sets one launch's tile shape and Triton schedule; `AttentionTuning` holds
the decode and prefill launches' knobs plus the split-KV policy. Every field is static (a
change is a recompile), so both dataclasses are frozen and hashable.
"""

import dataclasses

import jax.numpy as jnp
from jax.typing import DTypeLike


def _is_power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


@dataclasses.dataclass(frozen=True)
class KernelTuning:
    """Tile shape and schedule of one `pallas_call`."""

    block_m: int = 64
    """Matmul rows per program: query tokens x the query heads of one KV head (power of two)."""
    block_k: int = 64
    """Keys per tile of the KV walk (power of two)."""
    num_warps: int = 4
    num_stages: int = 1
    """Triton software-pipelining depth of the KV loop."""

    def __post_init__(self):
        for name in ("block_m", "block_k"):
            value = getattr(self, name)
            if not _is_power_of_two(value) or value < 16:
                raise ValueError(f"{name} must be a power of two >= 16, got {value}.")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}.")
        if not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages must be in [1, 6], got {self.num_stages}.")


@dataclasses.dataclass(frozen=True)
class AttentionTuning:
    """Knobs of the decode launch (rows with one query token) and the prefill launch."""

    decode: KernelTuning = KernelTuning(block_m=16, block_k=64)
    """`block_m` is ignored for decode: its rows are the query heads of one KV head."""
    prefill: KernelTuning = KernelTuning()
    decode_programs: int = 64
    """Target decode programs per KV head: a step with B rows splits each decode row's keys
    into at most min(max_kv_splits, decode_programs // B) segments, so few long rows still
    fill the GPU. The split count is computed on the device (no recompile)."""
    max_kv_splits: int = 16
    min_tiles_per_split: int = 2
    """Decode key tiles per segment at least: a row of n tiles takes at most
    ceil(n / min_tiles_per_split) segments, so a short row is not split (one segment writes
    its output directly and needs no merge)."""

    def __post_init__(self):
        for name in ("decode_programs", "max_kv_splits", "min_tiles_per_split"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")


# Defaults by head dim. The D 128 knobs won H200 sweeps (decode: 64-key tiles, 4 warps, 2
# stages; prefill: 128 x 128 tiles, 8 warps, 2 stages, 0.54 ms against 0.64 ms for 128 x 64 on
# a 4k prefill: benchmarks/results/2026-11-29-h200-paged-attention.md); the others are starting
# points for `python -m benchmarks.kernels.ragged_paged_attention --sweep-stages ...`. The
# tile area shrinks as head_dim grows so K, V, P and the accumulator stay in registers.
_DEFAULTS = {
    64: AttentionTuning(
        decode=KernelTuning(block_m=16, block_k=128, num_warps=4, num_stages=2),
        prefill=KernelTuning(block_m=128, block_k=64, num_warps=8, num_stages=2),
    ),
    128: AttentionTuning(
        decode=KernelTuning(block_m=16, block_k=64, num_warps=4, num_stages=2),
        prefill=KernelTuning(block_m=128, block_k=128, num_warps=8, num_stages=2),
    ),
    256: AttentionTuning(
        decode=KernelTuning(block_m=16, block_k=32, num_warps=4, num_stages=2),
        prefill=KernelTuning(block_m=64, block_k=32, num_warps=8, num_stages=2),
    ),
}


def default_tuning(head_dim: int, dtype: DTypeLike) -> AttentionTuning:
    """The tuned knobs of the nearest tabled head dim; float32 halves the prefill tile."""
    tuning = _DEFAULTS[min(_DEFAULTS, key=lambda tabled: abs(tabled - head_dim))]
    if jnp.dtype(dtype).itemsize > 2:
        prefill = dataclasses.replace(tuning.prefill, block_m=max(16, tuning.prefill.block_m // 2))
        tuning = dataclasses.replace(tuning, prefill=prefill)
    return tuning
