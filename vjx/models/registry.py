"""Hugging Face `architectures` names -> vjx model classes."""

from typing import Any

from flax import nnx

from vjx.models.bamba import BambaForCausalLM
from vjx.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from vjx.models.gemma2 import Gemma2ForCausalLM
from vjx.models.gemma3 import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from vjx.models.gpt_oss import GptOssForCausalLM
from vjx.models.granite import GraniteForCausalLM
from vjx.models.llama import LlamaForCausalLM
from vjx.models.llama_eagle import EagleLlamaForCausalLM
from vjx.models.llama_eagle3 import Eagle3LlamaForCausalLM
from vjx.models.mamba2 import Mamba2ForCausalLM
from vjx.models.mixtral import MixtralForCausalLM
from vjx.models.olmo2 import Olmo2ForCausalLM
from vjx.models.phi3 import Phi3ForCausalLM
from vjx.models.qwen2 import Qwen2ForCausalLM
from vjx.models.qwen2_moe import Qwen2MoeForCausalLM
from vjx.models.qwen3 import Qwen3ForCausalLM
from vjx.models.qwen3_moe import Qwen3MoeForCausalLM
from vjx.sharding.placement import kv_head_replicas

_MODELS: dict[str, type[nnx.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "Mamba2ForCausalLM": Mamba2ForCausalLM,
    "BambaForCausalLM": BambaForCausalLM,
}


_DRAFT_HEADS: dict[str, type[nnx.Module]] = {
    "EagleLlamaForCausalLM": EagleLlamaForCausalLM,
    "Eagle3LlamaForCausalLM": Eagle3LlamaForCausalLM,
}
"""Speculative decoding's draft heads, which run beside a target and never as one."""


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(hf_config: Any, is_draft_head: bool = False) -> type[nnx.Module]:
    """The module class for the first of `hf_config.architectures` that vjx implements (a
    draft head's, with `is_draft_head`)."""
    architectures = getattr(hf_config, "architectures", None) or []
    models = _DRAFT_HEADS if is_draft_head else _MODELS
    for name in architectures:
        if name in models:
            return models[name]
    raise ValueError(f"architectures {architectures} are not supported; vjx implements {supported_architectures()}.")


def verify_tensor_parallel(hf_config: Any, tensor_parallel_size: int, enable_expert_parallel: bool = False) -> None:
    """Raises ValueError unless the model's heads, KV heads, MLP width and vocabulary split
    evenly over `tensor_parallel_size` devices (KV heads may instead be repeated), and a MoE
    model's experts (with `enable_expert_parallel`) or each expert's width (without)."""
    # A model of state-space layers only (Mamba2) has no attention heads and no MLP.
    sizes = {
        name: getattr(hf_config, name)
        for name in ("num_attention_heads", "intermediate_size", "vocab_size")
        if getattr(hf_config, name, None)
    }
    # DeepSeek names its routed experts `n_routed_experts`, and has shared ones beside them.
    num_experts = getattr(hf_config, "num_experts", None) or getattr(hf_config, "n_routed_experts", None)
    if num_experts:
        if enable_expert_parallel:
            sizes["num_experts"] = num_experts
        elif getattr(hf_config, "moe_intermediate_size", None):
            sizes["moe_intermediate_size"] = hf_config.moe_intermediate_size
    if getattr(hf_config, "n_shared_experts", None):
        sizes["moe_intermediate_size * n_shared_experts"] = hf_config.moe_intermediate_size * hf_config.n_shared_experts
    for name, size in sizes.items():
        if size % tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size ({tensor_parallel_size}) must divide the model's {name} "
                f"({size}); divisors up to 8: {[d for d in range(1, 9) if size % d == 0]}."
            )
    num_heads = getattr(hf_config, "num_attention_heads", None)
    if num_heads:
        kv_head_replicas(getattr(hf_config, "num_key_value_heads", None) or num_heads, tensor_parallel_size)
