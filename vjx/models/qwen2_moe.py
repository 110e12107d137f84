"""Qwen2-MoE: Qwen 2's attention; on the layers `decoder_sparse_step` and `mlp_only_layers`
pick, a sparse MoE block (softmax router, `norm_topk_prob` renormalization) with a shared
expert scaled by its own sigmoid gate; a dense MLP on the others."""

from flax import nnx

from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.fused_moe import FusedMoE
from vjx.models.layers.mlp import GatedMLP
from vjx.models.layers.moe_block import SparseMoeBlock, moe_args
from vjx.models.qwen2 import Qwen2ForCausalLM


def is_sparse_layer(hf_config, layer_idx: int) -> bool:
    """Whether layer `layer_idx` is a MoE layer, by Qwen's rule."""
    mlp_only_layers = getattr(hf_config, "mlp_only_layers", None) or []
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    return layer_idx not in mlp_only_layers and hf_config.num_experts > 0 and (layer_idx + 1) % step == 0


def qwen_moe_block(ctx: BuildContext, *, shared_expert: bool) -> SparseMoeBlock:
    """Qwen's sparse block (Qwen2-MoE's with its gated shared expert, Qwen3-MoE's without)."""
    hf_config, dtype, rngs = ctx.hf_config, ctx.dtype, ctx.rngs
    args = moe_args(
        ctx, intermediate_size=hf_config.moe_intermediate_size, renormalize=getattr(hf_config, "norm_topk_prob", False)
    )
    shared = {}
    if shared_expert:
        size = hf_config.shared_expert_intermediate_size
        mlp = GatedMLP(ctx.args.hidden_size, size, hf_config.hidden_act, use_bias=False, dtype=dtype, rngs=rngs)
        shared = dict(shared_expert=mlp, shared_expert_gate=True)
    experts = FusedMoE(args, dtype=dtype, rngs=rngs)
    return SparseMoeBlock(args, experts=experts, **shared, dtype=dtype, rngs=rngs)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        if is_sparse_layer(ctx.hf_config, layer_idx):
            return qwen_moe_block(ctx, shared_expert=True)
        return super().make_mlp(ctx, layer_idx)
