"""`LoRARequest`: which adapter a request runs with, as vLLM names it.

A frozen dataclass, so it crosses the ZeroMQ seam between the front end and the engine core
inside the request message (vjx/engine/serial.py encodes dataclasses) and the scheduler can key
on it.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """One LoRA adapter, named by the client and numbered by the server.

    `lora_int_id` is the adapter's id (vLLM's: 1 and up; 0 would read as "no adapter"); the
    engine maps it to a device slot. `lora_path` is a PEFT adapter directory
    (`adapter_config.json` + `adapter_model.safetensors`, vjx/lora/peft_loader.py)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}.")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}.")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must be a non-empty string, got {self.lora_path!r}.")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id
