"""The runner's LoRA adapters: loaded from disk into host memory, written into the device's
`max_loras` slots as steps need them, and each step's per-token slot ids.

The scheduler keeps the running requests' distinct adapters within `max_loras`, so a step's
adapters always fit the slots. An adapter a step needs and the device lacks takes a free slot,
else the least recently used slot whose adapter the step does not need; host copies beyond
`max_cpu_loras` are dropped least recently used first and read again from disk when needed.
Writing a slot replaces the LoRA params' arrays with ones of the same shape, so nothing
recompiles; the runner re-reads the model's params afterwards (`params_changed`).
"""

import collections
import logging

import numpy as np
from flax import nnx

from vjx.lora.config import LoRAConfig
from vjx.lora.layers import clear_slot, write_adapter
from vjx.lora.peft_loader import LoRAAdapter, load_peft_adapter
from vjx.lora.request import LoRARequest

logger = logging.getLogger(__name__)

BASE_SLOT = -1
"""The slot id of a token that runs the base model (and of padding tokens)."""


class LoRAManager:
    """Host copies and device slots of the adapters, for one model with LoRA layers."""

    def __init__(self, model: nnx.Module, lora_config: LoRAConfig):
        self.model = model
        self.config = lora_config
        self._host: collections.OrderedDict[int, LoRAAdapter] = collections.OrderedDict()
        self._slots: collections.OrderedDict[int, int] = collections.OrderedDict()
        """Adapter id -> device slot, least recently used first."""
        self.params_changed = False
        """Set when a slot was written since the runner last read the params."""

    def warm_up(self) -> None:
        """Clears every slot once, which compiles the slot writers before the first request
        (a later write reuses them: no compile while serving)."""
        for slot in range(self.config.max_loras):
            clear_slot(self.model, slot)
        self.params_changed = True

    def prepare(self, lora: LoRARequest | None) -> None:
        """Reads a request's adapter into host memory as it enters the batch, so that a bad
        adapter (a missing directory, a rank over max_lora_rank) fails that request alone."""
        if lora is not None:
            self._host_copy(lora)

    def token_slots(self, lora_requests: list[LoRARequest | None], row_of_token: np.ndarray) -> np.ndarray:
        """Each token's slot (`BASE_SLOT` for the base model), given each row's adapter and
        each token's row; writes the adapters the step needs into slots first."""
        needed = {lora.lora_int_id: lora for lora in lora_requests if lora is not None}
        if len(needed) > self.config.max_loras:
            raise ValueError(f"a step needs {len(needed)} LoRA adapters, more than max_loras={self.config.max_loras}.")
        for lora in needed.values():
            self._activate(lora, keep=needed.keys())
        slot_of_row = np.array(
            [BASE_SLOT if lora is None else self._slots[lora.lora_int_id] for lora in lora_requests], np.int32
        )
        return slot_of_row[row_of_token] if len(slot_of_row) else np.zeros(0, np.int32)

    def _activate(self, lora: LoRARequest, keep) -> None:
        """Puts `lora` in a device slot (if not there already), evicting an adapter not in `keep`."""
        lora_id = lora.lora_int_id
        if lora_id in self._slots:
            self._slots.move_to_end(lora_id)
            return
        used = set(self._slots.values())
        free = [slot for slot in range(self.config.max_loras) if slot not in used]
        if free:
            slot = free[0]
        else:
            victim = next(other for other in self._slots if other not in keep)
            slot = self._slots.pop(victim)
        write_adapter(self.model, slot, self._host_copy(lora))
        self._slots[lora_id] = slot
        self.params_changed = True
        logger.info("LoRA adapter %s (id %d) written to device slot %d", lora.lora_name, lora_id, slot)

    def _host_copy(self, lora: LoRARequest) -> LoRAAdapter:
        lora_id = lora.lora_int_id
        if lora_id in self._host:
            self._host.move_to_end(lora_id)
            return self._host[lora_id]
        adapter = load_peft_adapter(lora.lora_path, max_lora_rank=self.config.max_lora_rank)
        self._host[lora_id] = adapter
        while len(self._host) > self.config.max_cpu_loras:
            self._host.popitem(last=False)
        return adapter
