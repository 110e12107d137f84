"""DeepSeek-V2/V3's sparse MoE block: a grouped top-k router, the fused experts, and shared
experts every token passes through (no gate of their own).

Legend: T tokens, D hidden, E experts, G expert groups, X experts per group, K experts per
token.

The router scores every expert in float32: a softmax over the logits (V2) or each logit's
sigmoid (V3, `topk_method` "noaux_tc"). The experts form `n_group` equal groups; each token
keeps its `topk_group` best groups and picks its K experts among them (V2's "greedy" is one
group). V3 picks by the scores plus a learned per-expert bias (`e_score_correction_bias`,
which balances the experts' load) and ranks a group by the sum of its two best; V2 ranks a
group by its best score. The routing weights are the picked experts' scores without the
bias, rescaled to sum to 1 with `norm_topk_prob`, times `routed_scaling_factor`.

Like every MoE block, the router runs on each device over the whole residual stream; the
experts split over the devices as vjx/models/layers/fused_moe.py describes.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.fused_moe import FusedMoE, MoEArgs, Router
from vjx.models.layers.mlp import GatedMLP
from vjx.models.layers.param import logical_param

SCORING_FUNCS = {"greedy": "softmax", "group_limited_greedy": "softmax", "noaux_tc": "sigmoid"}
"""Each `topk_method` and how it scores the experts."""


def topk_method(hf_config: Any) -> str:
    """The config's `topk_method`; V3's configs may omit it (transformers' V3 always routes by
    "noaux_tc")."""
    default = "noaux_tc" if hf_config.model_type == "deepseek_v3" else "greedy"
    method = getattr(hf_config, "topk_method", None) or default
    if method not in SCORING_FUNCS:
        raise ValueError(f"topk_method must be one of {sorted(SCORING_FUNCS)}, got {method!r}.")
    return method


def is_moe_layer(hf_config: Any, layer_idx: int) -> bool:
    """Whether layer `layer_idx` is a MoE layer: past the first `first_k_dense_replace`
    layers, every `moe_layer_freq`-th one (vLLM's rule; transformers' with a frequency of 1)."""
    freq = getattr(hf_config, "moe_layer_freq", 1) or 1
    return (
        getattr(hf_config, "n_routed_experts", None) is not None
        and layer_idx >= hf_config.first_k_dense_replace
        and layer_idx % freq == 0
    )


@dataclasses.dataclass(frozen=True)
class GroupedTopK:
    """DeepSeek's routing rule (vLLM's `grouped_topk`), as the config fixes it."""

    num_experts: int
    top_k: int
    num_expert_group: int
    """The experts split into this many equal groups of consecutive ids (1: plain top-k)."""
    topk_group: int
    """Each token keeps this many groups and picks its experts among them."""
    scoring_func: str
    """"softmax" over the logits (V2) or each logit's "sigmoid" (V3)."""
    renormalize: bool
    """The K weights are rescaled to sum to 1 (`norm_topk_prob`)."""
    routed_scaling_factor: float = 1.0
    """Multiplies the (renormalized) weights."""

    def __post_init__(self):
        if self.num_expert_group < 1 or self.num_experts % self.num_expert_group:
            raise ValueError(f"n_group must divide the {self.num_experts} experts, got {self.num_expert_group}.")
        group_size = self.num_experts // self.num_expert_group
        if self.scoring_func == "sigmoid" and group_size < 2:
            # V3 ranks a group by the sum of its two best experts.
            raise ValueError(f"n_group must leave 2 or more of the {self.num_experts} experts per group.")
        if not 1 <= self.topk_group <= self.num_expert_group:
            raise ValueError(f"topk_group must be in [1, {self.num_expert_group}], got {self.topk_group}.")
        if not 1 <= self.top_k <= self.topk_group * group_size:
            raise ValueError(
                f"num_experts_per_tok must be in [1, {self.topk_group * group_size}] (the experts of "
                f"topk_group groups), got {self.top_k}."
            )

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> "GroupedTopK":
        method = topk_method(hf_config)
        is_grouped = method != "greedy"
        return cls(
            num_experts=hf_config.n_routed_experts,
            top_k=hf_config.num_experts_per_tok,
            num_expert_group=hf_config.n_group if is_grouped else 1,
            topk_group=hf_config.topk_group if is_grouped else 1,
            scoring_func=SCORING_FUNCS[method],
            renormalize=bool(getattr(hf_config, "norm_topk_prob", False)),
            routed_scaling_factor=float(hf_config.routed_scaling_factor),
        )


def grouped_topk(
    router_logits: Float[Array, "T E"],
    routing: GroupedTopK,
    e_score_correction_bias: Float[Array, " E"] | None = None,
) -> tuple[Float[Array, "T K"], Int[Array, "T K"]]:
    """Each token's `routing.top_k` experts among its best groups and their float32 weights
    (the module docstring gives the rule); ties go to the lower index."""
    scores_TE = router_logits.astype(jnp.float32)
    scores_TE = jax.nn.softmax(scores_TE, axis=-1) if routing.scoring_func == "softmax" else jax.nn.sigmoid(scores_TE)
    num_tokens, num_groups = scores_TE.shape[0], routing.num_expert_group
    has_bias = e_score_correction_bias is not None
    choice_TE = scores_TE + e_score_correction_bias.astype(jnp.float32) if has_bias else scores_TE
    choice_TGX = choice_TE.reshape(num_tokens, num_groups, -1)
    if has_bias:
        group_scores_TG = jnp.sum(jax.lax.top_k(choice_TGX, 2)[0], axis=-1)
    else:
        group_scores_TG = jnp.max(choice_TGX, axis=-1)
    _, group_ids = jax.lax.top_k(group_scores_TG, routing.topk_group)
    is_kept_TG = jnp.any(group_ids[:, :, None] == jnp.arange(num_groups), axis=1)
    choice_TGX = jnp.where(is_kept_TG[:, :, None], choice_TGX, -jnp.inf)
    _, ids_TK = jax.lax.top_k(choice_TGX.reshape(num_tokens, -1), routing.top_k)
    weights_TK = jnp.take_along_axis(scores_TE, ids_TK, axis=-1)
    if routing.renormalize:
        weights_TK = weights_TK / jnp.sum(weights_TK, axis=-1, keepdims=True)
    return weights_TK * jnp.float32(routing.routed_scaling_factor), ids_TK.astype(jnp.int32)


class DeepseekV2Gate(Router):
    """The router's gate, float32 like transformers keeps it, with V3's float32
    `e_score_correction_bias` [E] when `routing` scores by sigmoid."""

    HF_NAMES = {"weight": "weight", "e_score_correction_bias": "e_score_correction_bias"}

    def __init__(self, hidden_size: int, routing: GroupedTopK, *, rngs):
        super().__init__(hidden_size, routing.num_experts, use_bias=False, dtype=jnp.float32, rngs=rngs)
        has_bias = routing.scoring_func == "sigmoid"
        zeros = jnp.zeros((routing.num_experts,), jnp.float32)
        self.e_score_correction_bias = logical_param(zeros, (None,)) if has_bias else None
        self.routing = routing

    def select_experts(self, x: Float[Array, "T D"]) -> tuple[Float[Array, "T K"], Int[Array, "T K"]]:
        """Each token's experts and their float32 weights (`grouped_topk`)."""
        bias = self.e_score_correction_bias
        return grouped_topk(self(x), self.routing, None if bias is None else bias[...])


class DeepseekV2MoE(nnx.Module):
    """experts(x, gate's grouped top-k) + shared_experts(x)."""

    def __init__(self, gate: DeepseekV2Gate, experts: FusedMoE, shared_experts: GatedMLP | None = None):
        self.gate = gate
        self.experts = experts
        self.shared_experts = shared_experts

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T D"]:
        weights_TK, ids_TK = self.gate.select_experts(x)
        out = self.experts.forward_routed(x, weights_TK, ids_TK)
        return out if self.shared_experts is None else out + self.shared_experts(x)


def deepseek_moe_block(ctx: BuildContext) -> DeepseekV2MoE:
    """DeepSeek-V2/V3's block from the config: `n_routed_experts` experts of width
    `moe_intermediate_size`, the router `GroupedTopK.from_hf_config` reads, and
    `n_shared_experts` shared experts fused into one MLP `n_shared_experts` times as wide."""
    hf_config, dtype, rngs = ctx.hf_config, ctx.dtype, ctx.rngs
    routing = GroupedTopK.from_hf_config(hf_config)
    args = MoEArgs(
        num_experts=routing.num_experts,
        top_k=routing.top_k,
        hidden_size=ctx.args.hidden_size,
        intermediate_size=hf_config.moe_intermediate_size,
        renormalize=routing.renormalize,
        activation=hf_config.hidden_act,
        expert_parallel=ctx.expert_parallel,
    )
    shared_experts = None
    if getattr(hf_config, "n_shared_experts", None):
        size = hf_config.moe_intermediate_size * hf_config.n_shared_experts
        shared_experts = GatedMLP(
            ctx.args.hidden_size, size, hf_config.hidden_act, use_bias=False, dtype=dtype, rngs=rngs
        )
    gate = DeepseekV2Gate(ctx.args.hidden_size, routing, rngs=rngs)
    return DeepseekV2MoE(gate, FusedMoE(args, dtype=dtype, rngs=rngs), shared_experts)
