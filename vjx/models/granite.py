"""IBM Granite (3.x dense): Llama's blocks with four scalars from the config: the embedding
multiplier, the softmax scale (`attention_multiplier`, not head_dim ** -0.5), a multiplier on
each block's residual branch, and a divisor of the logits (`logits_scaling`)."""

import dataclasses

from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.attention import AttentionArgs
from vjx.models.layers.decoder import BuildContext, LogitsArgs
from vjx.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class GraniteDecoderLayer(LlamaDecoderLayer):
    """x + m * attn(norm(x)), then x + m * mlp(norm(x)) for the residual multiplier m."""

    def __init__(self, args, self_attn, mlp, *, dtype, residual_multiplier: float):
        super().__init__(args, self_attn, mlp, dtype=dtype)
        self.residual_multiplier = residual_multiplier

    def __call__(
        self,
        x: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        attn_out, kv_cache = self.self_attn(self.input_layernorm(x), positions, kv_cache, md)
        x = x + attn_out * self.residual_multiplier
        x = x + self.mlp(self.post_attention_layernorm(x)) * self.residual_multiplier
        return x, kv_cache


class GraniteForCausalLM(LlamaForCausalLM):
    def attention_args(self, ctx: BuildContext, layer_idx: int) -> AttentionArgs:
        return dataclasses.replace(super().attention_args(ctx, layer_idx), sm_scale=ctx.hf_config.attention_multiplier)

    def make_layer(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        return GraniteDecoderLayer(
            ctx.args,
            self.make_attention(ctx, layer_idx),
            self.make_mlp(ctx, layer_idx),
            dtype=ctx.dtype,
            residual_multiplier=ctx.hf_config.residual_multiplier,
        )

    def embed_scale(self, ctx: BuildContext) -> float:
        return ctx.hf_config.embedding_multiplier

    def make_logits_args(self, ctx: BuildContext) -> LogitsArgs:
        return LogitsArgs(divisor=ctx.hf_config.logits_scaling)
