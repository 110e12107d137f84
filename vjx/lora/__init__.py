"""Multi-LoRA: adapter requests (`LoRARequest`), PEFT adapter loading (`load_peft_adapter`)
and the model-side slots (`add_lora`, `write_adapter`, `clear_slot`)."""

from vjx.lora.layers import LoRAContext, LoRAWeights, add_lora, clear_slot, write_adapter
from vjx.lora.peft_loader import SUPPORTED_TARGET_MODULES, LoRAAdapter, LoRAModuleWeights, load_peft_adapter
from vjx.lora.request import LoRARequest

__all__ = [
    "SUPPORTED_TARGET_MODULES",
    "LoRAAdapter",
    "LoRAContext",
    "LoRAModuleWeights",
    "LoRARequest",
    "LoRAWeights",
    "add_lora",
    "clear_slot",
    "load_peft_adapter",
    "write_adapter",
]
