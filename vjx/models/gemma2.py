"""Gemma 2: sandwich blocks (a norm before and after each branch, four per layer), Gemma's
(1 + w) RMSNorm in float32, GeGLU, embeddings scaled by sqrt(hidden), the softmax scale from
`query_pre_attn_scalar`, tanh soft-capping of the attention scores and of the final logits,
and sliding-window layers alternating with global ones (`layer_types`).

Legend: T tokens, D hidden.
"""

import dataclasses
import math

from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.attention import Attention, AttentionArgs
from vjx.models.layers.decoder import BuildContext, DecoderArgs, LogitsArgs
from vjx.models.layers.mlp import GatedMLP
from vjx.models.layers.norm import GemmaRMSNorm
from vjx.models.llama import LlamaForCausalLM


class GemmaDecoderLayer(nnx.Module):
    """x + norm(attn(norm(x))), then x + norm(mlp(norm(x)))."""

    def __init__(self, args: DecoderArgs, self_attn: Attention, mlp: GatedMLP, *, dtype):
        D, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(D, eps=eps, dtype=dtype)
        self.self_attn = self_attn
        self.post_attention_layernorm = GemmaRMSNorm(D, eps=eps, dtype=dtype)
        self.pre_feedforward_layernorm = GemmaRMSNorm(D, eps=eps, dtype=dtype)
        self.mlp = mlp
        self.post_feedforward_layernorm = GemmaRMSNorm(D, eps=eps, dtype=dtype)

    def __call__(
        self,
        x: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        attn_out, kv_cache = self.self_attn(self.input_layernorm(x), positions, kv_cache, md)
        x = x + self.post_attention_layernorm(attn_out)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x, kv_cache


class Gemma2ForCausalLM(LlamaForCausalLM):
    def attention_args(self, ctx: BuildContext, layer_idx: int) -> AttentionArgs:
        return dataclasses.replace(
            super().attention_args(ctx, layer_idx),
            sm_scale=ctx.hf_config.query_pre_attn_scalar**-0.5,
            soft_cap=ctx.hf_config.attn_logit_softcapping,
        )

    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> GatedMLP:
        args = ctx.args
        return GatedMLP(
            args.hidden_size,
            args.intermediate_size,
            ctx.hf_config.hidden_activation,
            use_bias=False,
            dtype=ctx.dtype,
            rngs=ctx.rngs,
        )

    def make_layer(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        attention, mlp = self.make_attention(ctx, layer_idx), self.make_mlp(ctx, layer_idx)
        return GemmaDecoderLayer(ctx.args, attention, mlp, dtype=ctx.dtype)

    def make_norm(self, ctx: BuildContext, num_features: int) -> nnx.Module:
        return GemmaRMSNorm(num_features, eps=ctx.args.rms_norm_eps, dtype=ctx.dtype)

    def embed_scale(self, ctx: BuildContext) -> float:
        return math.sqrt(ctx.args.hidden_size)

    def make_logits_args(self, ctx: BuildContext) -> LogitsArgs:
        return LogitsArgs(soft_cap=ctx.hf_config.final_logit_softcapping)
