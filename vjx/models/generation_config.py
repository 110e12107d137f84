"""A model's generation config, read as vLLM reads it (`generation_config="auto"`).

Two things come from it:
- default sampling parameters (`get_diff_sampling_param`): those of `SAMPLING_FIELDS` the
  file sets, `max_new_tokens` renamed `max_tokens`, for requests that leave them unset;
- extra EOS ids (`extra_eos_token_ids`): its `eos_token_id` list but the tokenizer's own
  EOS, which stop every request (unless `ignore_eos`) as its `stop_token_ids` do.
"""

import os
from typing import Any

import transformers

SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
"""The generation-config fields that become default sampling parameters (vLLM's list)."""


def try_get_generation_config(config_dir: str, hf_config: Any = None) -> dict[str, Any]:
    """The fields `config_dir`/generation_config.json sets (its difference from transformers'
    defaults). Without the file: those of a generation config made from `hf_config` (e.g.
    config.json's `eos_token_id`), or {} when `hf_config` is None."""
    if os.path.isfile(os.path.join(config_dir, "generation_config.json")):
        return transformers.GenerationConfig.from_pretrained(config_dir).to_diff_dict()
    if hf_config is None:
        return {}
    return transformers.GenerationConfig.from_model_config(hf_config).to_diff_dict()


def get_diff_sampling_param(generation_config: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """The default sampling parameters `generation_config` with `override` on top sets, as
    `SamplingParams` keyword arguments."""
    config = {**generation_config, **override}
    defaults = {name: config[name] for name in SAMPLING_FIELDS if config.get(name) is not None}
    if "max_new_tokens" in defaults:
        defaults["max_tokens"] = defaults.pop("max_new_tokens")
    return defaults


def extra_eos_token_ids(generation_config: dict[str, Any], eos_token_id: int | None) -> list[int]:
    """The generation config's EOS ids (one or a list) other than `eos_token_id`, in order."""
    eos_ids = generation_config.get("eos_token_id")
    if eos_ids is None:
        return []
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else eos_ids
    return [t for t in dict.fromkeys(eos_ids) if t != eos_token_id]
