"""OpenAIServingModels: the names the server answers to (the base model's and its LoRA
adapters'), `/v1/models` and `/v1/models/{name}`, and vLLM's runtime adapter routes
`/v1/load_lora_adapter` and `/v1/unload_lora_adapter`.

A request whose `model` names an adapter runs with that adapter's `LoRARequest`. Adapters come
from `--lora-modules` at start-up and, with `--allowed-lora-dir`, from the load route, whose
paths must lie under that directory. Each load gets a new `lora_int_id`, so an adapter
unloaded and loaded again (or replaced with `load_inplace`) never meets the old one's cached
prefix blocks; requests already running on an unloaded adapter finish with it.
"""

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import time

from serving.errors import OpenAIError
from serving.protocol import LoadLoRAAdapterRequest, ModelCard, ModelList, UnloadLoRAAdapterRequest
from vjx.lora.request import LoRARequest

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` entry: `name=path`, or vLLM's JSON form
    `{"name": ..., "path": ..., "base_model_name": ...}`."""

    name: str
    path: str
    base_model_name: str | None = None

    @classmethod
    def parse(cls, text: str) -> "LoRAModulePath":
        if text.lstrip().startswith("{"):
            try:
                fields = json.loads(text)
                return cls(fields["name"], fields["path"], fields.get("base_model_name"))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"lora_modules entry {text!r} is not JSON with 'name' and 'path': {e}.") from None
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"lora_modules entries must be name=path or JSON, got {text!r}.")
        return cls(name, path)


class OpenAIServingModels:
    """`served_model_names[0]` is the name base-model responses carry; requests may use any of
    them, or an adapter's name (responses then carry it)."""

    def __init__(self, served_model_names: list[str], model_path: str, max_model_len: int, engine=None):
        """`engine`: the AsyncLLM that loads adapters (None: a server without LoRA)."""
        if not served_model_names:
            raise ValueError("served_model_names must hold at least one name, got [].")
        self.served_model_names = list(served_model_names)
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.created = int(time.time())
        self.engine = engine
        self.lora_requests: dict[str, LoRARequest] = {}
        self._lora_parents: dict[str, str] = {}
        self._lora_ids = itertools.count(1)
        self._lock = asyncio.Lock()
        """Held by a load or unload: two loads of one name cannot both pass the name check."""

    @classmethod
    def default_names(cls, model_arg: str | None, model_path: str) -> list[str]:
        """vLLM's default: the `--model` argument as given; the embedded model's directory name
        when no model was given."""
        return [model_arg if model_arg is not None else os.path.basename(os.path.normpath(model_path))]

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def is_served(self, name: str) -> bool:
        return name in self.served_model_names or name in self.lora_requests

    def lora_request(self, name: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names; None for the base model."""
        return self.lora_requests.get(name) if name is not None else None

    def response_name(self, requested: str | None) -> str:
        """The `model` a response carries, given the request's (checked to be served): the
        adapter's name, else the base model's first name."""
        return self.model_name if requested is None or requested in self.served_model_names else requested

    def model_card(self, name: str) -> ModelCard | None:
        """`GET /v1/models/{name}`'s card; None for a name not served."""
        if name in self.lora_requests:
            lora = self.lora_requests[name]
            return ModelCard(id=name, created=self.created, root=lora.lora_path, parent=self._lora_parents[name])
        if not self.is_served(name):
            return None
        return ModelCard(id=name, created=self.created, root=self.model_path, max_model_len=self.max_model_len)

    def list_models(self) -> ModelList:
        return ModelList(data=[self.model_card(name) for name in [*self.served_model_names, *self.lora_requests]])

    async def init_static_loras(self, lora_modules: list[LoRAModulePath]) -> None:
        """Loads the `--lora-modules` adapters; a bad one stops the start-up (ValueError)."""
        for module in lora_modules:
            try:
                await self._load(module.name, module.path, module.base_model_name)
            except OpenAIError as e:
                raise ValueError(f"lora_modules entry {module.name}={module.path}: {e.message}") from None

    async def load_lora_adapter(self, request: LoadLoRAAdapterRequest, allowed_dir: str) -> str:
        """Loads an adapter from under `allowed_dir`; `load_inplace` replaces one of that name."""
        path, root = os.path.realpath(request.lora_path), os.path.realpath(allowed_dir)
        if os.path.commonpath([path, root]) != root:
            raise OpenAIError("lora_path must lie under the server's --allowed-lora-dir.", 400, "lora_path")
        async with self._lock:
            old = self.lora_requests.get(request.lora_name)
            if old is not None and not request.load_inplace:
                raise OpenAIError(f"The lora adapter '{request.lora_name}' has already been loaded.", 400, "lora_name")
            await self._load(request.lora_name, path, None)
            if old is not None:
                await self.engine.remove_lora(old.lora_int_id)
        return f"Success: LoRA adapter '{request.lora_name}' added successfully."

    async def _load(self, name: str, path: str, base_model_name: str | None) -> None:
        if not name:
            raise OpenAIError("lora_name must not be empty.", 400, "lora_name")
        if name in self.served_model_names:
            raise OpenAIError(f"lora_name '{name}' is the base model's name.", 400, "lora_name")
        lora = LoRARequest(name, next(self._lora_ids), path)
        try:
            await self.engine.add_lora(lora)
        except ValueError as e:
            not_found = not os.path.isfile(os.path.join(path, "adapter_config.json"))
            raise OpenAIError(str(e), 404 if not_found else 400, "lora_path") from None
        self.lora_requests[name] = lora
        self._lora_parents[name] = base_model_name if base_model_name in self.served_model_names else self.model_name
        logger.info("Loaded LoRA adapter '%s' (id %d) from %s", name, lora.lora_int_id, path)

    async def unload_lora_adapter(self, request: UnloadLoRAAdapterRequest) -> str:
        """Unloads an adapter named by `lora_name` or `lora_int_id` (both: they must agree)."""
        if request.lora_name is None and request.lora_int_id is None:
            raise OpenAIError("Either 'lora_name' or 'lora_int_id' must be provided.", 400)
        async with self._lock:
            lora = self._find(request)
            del self.lora_requests[lora.lora_name], self._lora_parents[lora.lora_name]
            await self.engine.remove_lora(lora.lora_int_id)
        logger.info("Removed LoRA adapter '%s' (id %d)", lora.lora_name, lora.lora_int_id)
        return f"Success: LoRA adapter '{lora.lora_name}' removed successfully."

    def _find(self, request: UnloadLoRAAdapterRequest) -> LoRARequest:
        matches = [
            lora
            for lora in self.lora_requests.values()
            if request.lora_name in (None, lora.lora_name) and request.lora_int_id in (None, lora.lora_int_id)
        ]
        if not matches:
            wanted = request.lora_name if request.lora_name is not None else request.lora_int_id
            raise OpenAIError(f"The lora adapter '{wanted}' cannot be found.", 404, "lora_name")
        return matches[0]
