"""Phi-3: Llama's blocks, with q/k/v and gate/up already fused in the checkpoint
(`qkv_proj`, `gate_up_proj`), and LongRoPE on the long-context sizes."""

from vjx.models.layers.attention import Attention
from vjx.models.layers.linear import FusedMergedLinear, FusedQKVLinear, MergedLinear
from vjx.models.layers.mlp import GatedMLP
from vjx.models.llama import LlamaForCausalLM


class Phi3Attention(Attention):
    QKV_LINEAR = FusedQKVLinear


class Phi3MLP(GatedMLP):
    def make_gate_up_proj(self, hidden_size: int, intermediate_size: int, **kwargs) -> MergedLinear:
        return FusedMergedLinear(2, hidden_size, intermediate_size, ("embed", "mlp"), **kwargs)


class Phi3ForCausalLM(LlamaForCausalLM):
    ATTENTION = Phi3Attention
    MLP = Phi3MLP
