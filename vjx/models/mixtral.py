"""Mixtral: Mistral's attention, and a sparse MoE block in every layer (softmax router, top-2,
weights renormalized). The checkpoint calls the block `block_sparse_moe` and an expert's
projections w1 (gate), w3 (up) and w2 (down)."""

from flax import nnx

from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.fused_moe import FusedMoE
from vjx.models.layers.moe_block import SparseMoeBlock, moe_args
from vjx.models.llama import LlamaForCausalLM


class MixtralForCausalLM(LlamaForCausalLM):
    CHECKPOINT_SUBSTRINGS = {".block_sparse_moe.": ".mlp."}

    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        args = moe_args(ctx, intermediate_size=ctx.args.intermediate_size, renormalize=True)
        experts = FusedMoE(args, expert_parts=("w1", "w3", "w2"), dtype=ctx.dtype, rngs=ctx.rngs)
        return SparseMoeBlock(args, experts=experts, dtype=ctx.dtype, rngs=ctx.rngs)
