"""`LoRAConfig`: how many adapters an engine serves at once, as vLLM's engine arguments say."""

import dataclasses

MAX_LORA_RANK_LIMIT = 512
"""The largest `max_lora_rank` vjx takes (vLLM's largest supported rank)."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA serving (`enable_lora`)."""

    max_loras: int
    """Adapters resident on the device at once: the slots every LoRA layer stacks, and the most
    distinct adapters one step may run."""
    max_lora_rank: int
    """The largest adapter rank; each slot is this wide, smaller ranks padded with zeros."""
    max_cpu_loras: int
    """Adapters kept loaded in host memory (least recently used dropped first), >= max_loras."""


def create_lora_config(
    enable_lora: bool, max_loras: int, max_lora_rank: int, max_cpu_loras: int | None
) -> LoRAConfig | None:
    """The engine's `LoRAConfig` (None without `enable_lora`), its bounds checked."""
    if not enable_lora:
        return None
    if max_loras < 1:
        raise ValueError(f"max_loras must be >= 1, got {max_loras}.")
    if not 1 <= max_lora_rank <= MAX_LORA_RANK_LIMIT:
        raise ValueError(f"max_lora_rank must be in [1, {MAX_LORA_RANK_LIMIT}], got {max_lora_rank}.")
    max_cpu_loras = max_loras if max_cpu_loras is None else max_cpu_loras
    if max_cpu_loras < max_loras:
        raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras}).")
    return LoRAConfig(max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras)
