"""Qwen3-MoE: Qwen 3's attention (q/k norms, no biases) and Qwen2-MoE's sparse layers
without the shared expert."""

from flax import nnx

from vjx.models.layers.decoder import BuildContext
from vjx.models.qwen2_moe import is_sparse_layer, qwen_moe_block
from vjx.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        if is_sparse_layer(ctx.hf_config, layer_idx):
            return qwen_moe_block(ctx, shared_expert=False)
        return super().make_mlp(ctx, layer_idx)
