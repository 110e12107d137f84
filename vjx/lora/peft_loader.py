"""Reads a PEFT LoRA adapter directory into host arrays: `adapter_config.json` and
`adapter_model.safetensors`, as `peft`'s `save_pretrained` writes them.

An adapter adds scaling * B @ A to the weight W [out, in] of each module it targets, with A
[r, in] and B [out, r] stored as
`base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight`, and
scaling = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)). vjx serves plain LoRA on the seven
projections of a dense decoder layer; every other PEFT feature changes the math or adds
weights vjx does not apply, so an adapter that uses one is refused rather than served wrong.
"""

import dataclasses
import json
import math
import pathlib
import re

import numpy as np

# The model loader's reader: memory-mapped, and it reads bfloat16, which `safetensors`' numpy
# API does not.
from vjx.models.loader import _read_safetensors

SUPPORTED_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections an adapter may target (PEFT's module names)."""

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_TENSOR_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")

_UNSUPPORTED_FIELDS = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "lora_bias": "a bias on lora_B",
    "fan_in_fan_out": "transposed (Conv1D) base weights",
    "modules_to_save": "fully trained extra modules",
    "rank_pattern": "per-module ranks",
    "alpha_pattern": "per-module alphas",
    "layer_replication": "replicated layers",
    "target_parameters": "LoRA on raw parameters",
    "trainable_token_indices": "trained token embeddings",
    "alora_invocation_tokens": "activated LoRA",
    "use_qalora": "QA-LoRA",
    "use_bdlora": "block-diagonal LoRA",
    "arrow_config": "Arrow routing",
    "kasa_config": "KaSA (a trained diagonal between A and B)",
    "monteclora_config": "MonteCLoRA",
}
"""adapter_config.json fields that must be unset, false or empty, and what they would add."""


@dataclasses.dataclass(frozen=True)
class LoRAModuleWeights:
    """One target module's low-rank factors, float32, as PEFT stores them."""

    lora_a: np.ndarray
    """[r, in]: the down projection."""
    lora_b: np.ndarray
    """[out, r]: the up projection (not yet scaled)."""


@dataclasses.dataclass(frozen=True)
class LoRAAdapter:
    """A PEFT LoRA adapter on the host, ready to be written into a device slot
    (vjx/lora/layers.py `write_adapter`)."""

    rank: int
    """r: every module's rank."""
    scaling: float
    """Factor on B @ A: lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA."""
    weights: dict[tuple[int, str], LoRAModuleWeights]
    """(layer index, module name such as "q_proj") -> its factors; modules and layers the
    adapter does not target are absent (they add nothing)."""


def load_peft_adapter(lora_path: str | pathlib.Path, *, max_lora_rank: int) -> LoRAAdapter:
    """The adapter in directory `lora_path`; raises ValueError naming the field or file for
    one vjx cannot serve (missing files, r outside [1, max_lora_rank], targets outside
    `SUPPORTED_TARGET_MODULES`, or one of the PEFT features in `_UNSUPPORTED_FIELDS`)."""
    directory = pathlib.Path(lora_path)
    if not directory.is_dir():
        raise ValueError(f"lora_path must be a PEFT adapter directory, got {str(lora_path)!r}, which is not one.")
    config = _read_config(directory / CONFIG_FILE)
    rank, scaling = _check_config(config, max_lora_rank)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ValueError(f"lora_path {str(directory)!r} lacks {WEIGHTS_FILE} (vjx reads no pickled adapter_model.bin).")
    return LoRAAdapter(rank=rank, scaling=scaling, weights=_read_weights(weights_path, rank))


def _read_config(path: pathlib.Path) -> dict:
    if not path.is_file():
        raise ValueError(f"lora_path {str(path.parent)!r} lacks {CONFIG_FILE}.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}.") from None


def _check_config(config: dict, max_lora_rank: int) -> tuple[int, float]:
    """The adapter's rank and scaling, once every field is one vjx serves."""
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise ValueError(f"peft_type must be 'LORA', got {peft_type!r}.")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_lora_rank:
        raise ValueError(f"r (the adapter's rank) must be in [1, {max_lora_rank}] (max_lora_rank), got {rank!r}.")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"lora_alpha must be a number, got {alpha!r}.")
    if config.get("bias", "none") != "none":
        raise ValueError(f"bias must be 'none' (vjx adds no trained biases), got {config['bias']!r}.")
    for field, feature in _UNSUPPORTED_FIELDS.items():
        if config.get(field):
            raise ValueError(f"{field} must be unset or empty: vjx does not serve {feature}; got {config[field]!r}.")
    _check_target_modules(config.get("target_modules"))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora", False) else alpha / rank
    return rank, float(scaling)


def _check_target_modules(target_modules) -> None:
    """A list must name supported modules only; a regex string is checked by the tensors it
    produced (`_read_weights`)."""
    if isinstance(target_modules, str):
        return
    if not target_modules:
        raise ValueError(f"target_modules must name at least one module, got {target_modules!r}.")
    unsupported = sorted(set(target_modules) - set(SUPPORTED_TARGET_MODULES))
    if unsupported:
        raise ValueError(
            f"target_modules holds {unsupported}; vjx serves LoRA on {list(SUPPORTED_TARGET_MODULES)} only."
        )


def _read_weights(path: pathlib.Path, rank: int) -> dict[tuple[int, str], LoRAModuleWeights]:
    factors: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for name, tensor in _read_safetensors(path):
        match = _TENSOR_NAME.fullmatch(name)
        if match is None or match[2] not in SUPPORTED_TARGET_MODULES:
            raise ValueError(
                f"tensor {name!r} in {path} is not the lora_A/lora_B weight of a decoder layer's "
                f"{list(SUPPORTED_TARGET_MODULES)}; vjx serves LoRA on those modules only."
            )
        factors.setdefault((int(match[1]), match[2]), {})[match[3]] = np.asarray(tensor, np.float32)
    if not factors:
        raise ValueError(f"{path} holds no LoRA weights.")
    weights = {}
    for (layer, module), pair in sorted(factors.items()):
        where = f"layer {layer} {module} in {path}"
        if set(pair) != {"A", "B"}:
            raise ValueError(f"{where} has lora_{''.join(pair)} but not both lora_A and lora_B.")
        lora_a, lora_b = pair["A"], pair["B"]
        if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != rank or lora_b.shape[1] != rank:
            raise ValueError(
                f"{where}: lora_A must be [r, in] and lora_B [out, r] with r = {rank}, "
                f"got {lora_a.shape} and {lora_b.shape}."
            )
        weights[layer, module] = LoRAModuleWeights(lora_a, lora_b)
    return weights
