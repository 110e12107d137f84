"""Llama-family causal LM (Llama 2/3, SmolLM2, Mistral) as a Flax NNX module.

Legend: T tokens, D hidden.

Pre-norm blocks: x + attn(norm(x)), then x + mlp(norm(x)), with the shared attention, gated
MLP and decoder skeleton (vjx/models/layers). Compute runs in the model dtype; norms and the
attention softmax run in float32, as in HF. Qwen 2 and Granite reuse these blocks.
"""

from typing import Any

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.backend import AttentionBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.attention import Attention, AttentionArgs, layer_sliding_window
from vjx.models.layers.decoder import DecoderArgs, DecoderForCausalLM, DecoderModel
from vjx.models.layers.mlp import GatedMLP
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.rotary import RotaryEmbedding


def llama_attention_args(hf_config: Any, args: DecoderArgs, layer_idx: int, **overrides) -> AttentionArgs:
    """The attention of layer `layer_idx` as Llama's config describes it."""
    bias = getattr(hf_config, "attention_bias", False)
    fields = dict(
        hidden_size=args.hidden_size,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        sm_scale=args.head_dim**-0.5,
        qkv_bias=bias,
        o_bias=bias,
        sliding_window=layer_sliding_window(hf_config, layer_idx),
    )
    return AttentionArgs(**{**fields, **overrides})


class LlamaDecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, args: DecoderArgs, self_attn: Attention, mlp: GatedMLP, *, dtype):
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

    def __init__(
        self,
        hf_config: Any,
        *,
        dtype,
        backend: AttentionBackend,
        rngs: nnx.Rngs,
        max_model_len: int | None = None,
    ):
        args = DecoderArgs.from_hf_config(hf_config)
        dtype = jnp.dtype(dtype)
        rotary = RotaryEmbedding.from_hf_config(hf_config, args.head_dim, max_model_len=max_model_len)
        hidden_act = getattr(hf_config, "hidden_act", "silu")
        mlp_bias = getattr(hf_config, "mlp_bias", False)

        def make_layer(i: int) -> LlamaDecoderLayer:
            attn_args = llama_attention_args(hf_config, args, i)
            self_attn = Attention(attn_args, rotary, dtype=dtype, backend=backend, rngs=rngs)
            mlp = GatedMLP(
                args.hidden_size, args.intermediate_size, hidden_act, use_bias=mlp_bias, dtype=dtype, rngs=rngs
            )
            return LlamaDecoderLayer(args, self_attn, mlp, dtype=dtype)

        norm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps, dtype=dtype)
        model = DecoderModel(args, make_layer, norm, dtype=dtype, rngs=rngs)
        super().__init__(model, args, dtype=dtype, rngs=rngs)
