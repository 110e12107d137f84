"""Qwen 3: Qwen's blocks without the q/k/v biases, a per-head RMSNorm of q and k before RoPE,
and `head_dim` from the config (128 on every size, not hidden / heads)."""

from vjx.models.layers.attention import QKNormAttention
from vjx.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    ATTENTION = QKNormAttention
