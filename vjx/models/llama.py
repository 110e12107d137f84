"""Llama-family causal LM (Llama 2/3, SmolLM2, Mistral) as a Flax NNX module.

Legend: T tokens, D hidden.

Pre-norm blocks: x + attn(norm(x)), then x + mlp(norm(x)), from the shared attention, gated
MLP and decoder skeleton (vjx/models/layers). Compute runs in the model dtype; norms and the
attention softmax run in float32, as in HF. The families built from the same blocks (Qwen 2
and 3, Phi-3, Granite) subclass `LlamaForCausalLM` and override its hooks.
"""

from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.attention import Attention, AttentionArgs, layer_sliding_window
from vjx.models.layers.decoder import BuildContext, DecoderArgs, DecoderForCausalLM
from vjx.models.layers.mlp import GatedMLP
from vjx.models.layers.norm import RMSNorm


class LlamaDecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, args: DecoderArgs, self_attn: nnx.Module, mlp: nnx.Module, *, dtype):
        eps = args.rms_norm_eps
        self.input_layernorm = RMSNorm(args.hidden_size, eps=eps, dtype=dtype)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(args.hidden_size, eps=eps, dtype=dtype)
        self.mlp = mlp

    def __call__(
        self,
        x: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        attn_out, kv_cache = self.self_attn(self.input_layernorm(x), positions, kv_cache, md)
        x = x + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv_cache


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama, Mistral (a `sliding_window` on every layer) and SmolLM2."""

    ATTENTION: type[Attention] = Attention
    MLP: type[GatedMLP] = GatedMLP

    def attention_args(self, ctx: BuildContext, layer_idx: int) -> AttentionArgs:
        """Layer `layer_idx`'s attention as the config describes it."""
        args, bias = ctx.args, getattr(ctx.hf_config, "attention_bias", False)
        return AttentionArgs(
            hidden_size=args.hidden_size,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            sm_scale=args.head_dim**-0.5,
            qkv_bias=bias,
            o_bias=bias,
            sliding_window=layer_sliding_window(ctx.hf_config, layer_idx),
            rms_norm_eps=args.rms_norm_eps,
        )

    def make_attention(self, ctx: BuildContext, layer_idx: int) -> Attention:
        return self.ATTENTION(
            self.attention_args(ctx, layer_idx), ctx.rotary(), dtype=ctx.dtype, backend=ctx.backend, rngs=ctx.rngs
        )

    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        """Layer `layer_idx`'s MLP (a MoE family's sparse block on its MoE layers)."""
        hidden_act = getattr(ctx.hf_config, "hidden_act", "silu")
        use_bias = getattr(ctx.hf_config, "mlp_bias", False)
        args = ctx.args
        return self.MLP(
            args.hidden_size, args.intermediate_size, hidden_act, use_bias=use_bias, dtype=ctx.dtype, rngs=ctx.rngs
        )

    def make_layer(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        attention, mlp = self.make_attention(ctx, layer_idx), self.make_mlp(ctx, layer_idx)
        return LlamaDecoderLayer(ctx.args, attention, mlp, dtype=ctx.dtype)
