"""Hugging Face `architectures` names -> vjx model classes, and the KV cache each needs."""

import dataclasses
from typing import Any

from flax import nnx

from vjx.models.llama import LlamaForCausalLM

_MODELS: dict[str, type[nnx.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
}


@dataclasses.dataclass(frozen=True)
class KVCacheSpec:
    """What the worker needs to size and allocate the paged KV cache of a model."""

    num_layers: int
    """One cache array per layer."""
    num_kv_heads: int
    head_dim: int


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(hf_config: Any) -> type[nnx.Module]:
    """The module class for the first of `hf_config.architectures` that vjx implements."""
    architectures = getattr(hf_config, "architectures", None) or []
    for name in architectures:
        if name in _MODELS:
            return _MODELS[name]
    raise ValueError(
        f"architectures {architectures} are not supported; vjx implements "
        f"{supported_architectures()}."
    )


def get_kv_cache_spec(hf_config: Any) -> KVCacheSpec:
    """Layers, KV heads and head dim, read the way every registered decoder reads them."""
    get_model_class(hf_config)
    num_heads = hf_config.num_attention_heads
    return KVCacheSpec(
        num_layers=hf_config.num_hidden_layers,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
    )
