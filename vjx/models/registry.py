"""Hugging Face `architectures` names -> vjx model classes, and the KV cache each needs."""

import dataclasses
from typing import Any

from flax import nnx

from vjx.models.llama import LlamaForCausalLM
from vjx.sharding.placement import kv_head_replicas

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
    """KV heads the cache holds: the model's, repeated when there are fewer than TP devices."""
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


def get_kv_cache_spec(hf_config: Any, tensor_parallel_size: int = 1) -> KVCacheSpec:
    """Layers, KV heads and head dim, read the way every registered decoder reads them.

    With fewer KV heads than `tensor_parallel_size`, the loader repeats each head so that
    every device holds one (vjx/sharding/placement.py); the cache holds the repeated heads.
    """
    get_model_class(hf_config)
    num_heads = hf_config.num_attention_heads
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    return KVCacheSpec(
        num_layers=hf_config.num_hidden_layers,
        num_kv_heads=num_kv_heads * kv_head_replicas(num_kv_heads, tensor_parallel_size),
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
    )


def verify_tensor_parallel(hf_config: Any, tensor_parallel_size: int) -> None:
    """Raises ValueError unless the model's heads, KV heads, MLP width and vocabulary split
    evenly over `tensor_parallel_size` devices (KV heads may instead be repeated)."""
    num_heads = hf_config.num_attention_heads
    sizes = {
        "num_attention_heads": num_heads,
        "intermediate_size": hf_config.intermediate_size,
        "vocab_size": hf_config.vocab_size,
    }
    for name, size in sizes.items():
        if size % tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size ({tensor_parallel_size}) must divide the model's {name} "
                f"({size}); divisors up to 8: {[d for d in range(1, 9) if size % d == 0]}."
            )
    kv_head_replicas(getattr(hf_config, "num_key_value_heads", None) or num_heads, tensor_parallel_size)
