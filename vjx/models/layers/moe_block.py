"""The sparse MoE block of the MoE families: a router, the fused experts, and optionally a
shared expert every token passes through (Qwen2-MoE: scaled by a sigmoid gate of its own).

Legend: T tokens, D hidden.
"""

from typing import Any

import jax
from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.fused_moe import FusedMoE, MoEArgs, Router
from vjx.models.layers.mlp import GatedMLP


def moe_args(ctx: BuildContext, *, intermediate_size: int, renormalize: bool, **kwargs: Any) -> MoEArgs:
    """The `MoEArgs` the config gives (`num_experts`, `num_experts_per_tok`), plus the
    family's width and rules."""
    return MoEArgs(
        num_experts=ctx.hf_config.num_experts,
        top_k=ctx.hf_config.num_experts_per_tok,
        hidden_size=ctx.args.hidden_size,
        intermediate_size=intermediate_size,
        renormalize=renormalize,
        expert_parallel=ctx.expert_parallel,
        **kwargs,
    )


class SparseMoeBlock(nnx.Module):
    """experts(x, gate(x)) (+ the shared expert's output)."""

    def __init__(
        self,
        args: MoEArgs,
        *,
        experts: FusedMoE,
        shared_expert: GatedMLP | None = None,
        shared_expert_gate: bool = False,
        dtype,
        rngs,
    ):
        self.gate = Router(args.hidden_size, args.num_experts, use_bias=args.use_bias, dtype=dtype, rngs=rngs)
        self.experts = experts
        self.shared_expert = shared_expert
        self.shared_expert_gate = (
            Router(args.hidden_size, 1, use_bias=False, dtype=dtype, rngs=rngs) if shared_expert_gate else None
        )

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T D"]:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is None:
            return out
        shared = self.shared_expert(x)
        if self.shared_expert_gate is not None:
            shared = jax.nn.sigmoid(self.shared_expert_gate(x)).astype(x.dtype) * shared
        return out + shared
