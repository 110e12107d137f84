"""The runner's LoRA adapters: loaded from disk into host memory, written into the device's
`max_loras` slots as steps need them, and each step's per-token slot ids.

The scheduler keeps the running requests' distinct adapters within `max_loras`, so a step's
adapters always fit the slots. An adapter a step needs and the device lacks takes a free slot,
else the least recently used slot whose adapter the step does not need. Host copies beyond
`max_cpu_loras` are dropped least recently used first, except pinned ones and those of requests
in the runner (`in_use`): a request's adapter is read from disk once, as it enters the batch,
and never again while it runs, so a step never reads the disk. Writing a slot replaces the LoRA
params' arrays with ones of the same shape, so nothing recompiles; the runner re-reads the
model's params afterwards (`params_changed`).

`add_adapter`, `remove_adapter`, `pin_adapter` and `list_adapters` are vLLM's `add_lora`,
`remove_lora`, `pin_lora` and `list_loras` (the engine's utilities, the server's runtime
adapter routes).
"""

import collections
import logging
from collections.abc import Callable

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

    def __init__(self, model: nnx.Module, lora_config: LoRAConfig, in_use: Callable[[], set[int]]):
        """`in_use`: the adapter ids of the requests in the runner (running or preempted)."""
        self.model = model
        self.config = lora_config
        self.in_use = in_use
        self._host: collections.OrderedDict[int, LoRAAdapter] = collections.OrderedDict()
        self._pinned: set[int] = set()
        self._removed: set[int] = set()
        """Removed while requests used them: dropped at the next trim once they do not."""
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
        self._trim_host(keep=lora_id)
        return adapter

    def _trim_host(self, keep: int | None = None) -> None:
        """Drops host copies, least recently used first, down to max_cpu_loras; pinned ones,
        those in use and `keep` stay (so the host may hold more while they run)."""
        in_use = self.in_use()
        for lora_id in self._removed - in_use:
            self._host.pop(lora_id, None)
            self._slots.pop(lora_id, None)
        self._removed &= in_use
        excess = len(self._host) - self.config.max_cpu_loras
        kept = self._pinned | in_use | {keep}
        for lora_id in [lora_id for lora_id in self._host if lora_id not in kept][: max(excess, 0)]:
            del self._host[lora_id]

    def add_adapter(self, lora: LoRARequest) -> bool:
        """Reads `lora` into host memory ahead of its requests (a bad adapter raises
        ValueError); False when it was there already."""
        self._trim_host()
        if lora.lora_int_id in self._host:
            self._host.move_to_end(lora.lora_int_id)
            was_removed = lora.lora_int_id in self._removed
            self._removed.discard(lora.lora_int_id)
            return was_removed
        self._host_copy(lora)
        return True

    def remove_adapter(self, lora_id: int) -> bool:
        """Forgets adapter `lora_id`: its host copy and device slot are freed, at once unless
        requests in the runner still use it (then once they have finished). False when the
        adapter was not loaded."""
        if lora_id not in self.list_adapters():
            return False
        self._pinned.discard(lora_id)
        self._removed.add(lora_id)
        self._trim_host()
        return True

    def pin_adapter(self, lora_id: int) -> bool:
        """Keeps adapter `lora_id` in host memory until it is removed (vLLM's pin_lora), at
        most max_cpu_loras of them."""
        if lora_id not in self.list_adapters():
            raise ValueError(f"pin_lora: LoRA adapter {lora_id} is not loaded (add_lora it first).")
        if lora_id not in self._pinned and len(self._pinned) >= self.config.max_cpu_loras:
            raise ValueError(f"pin_lora: at most max_cpu_loras={self.config.max_cpu_loras} adapters may be pinned.")
        self._pinned.add(lora_id)
        return True

    def list_adapters(self) -> set[int]:
        """The ids of the adapters in host memory (less those removed)."""
        return set(self._host) - self._removed
