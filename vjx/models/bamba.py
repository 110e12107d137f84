"""Bamba (IBM's hybrid): Llama-style attention on the layers `attn_layer_indices` names, Mamba2
mixers on the rest, a gated MLP after either.

Legend: T tokens, D hidden.

Each block is x + mixer(norm(x)), then x + mlp(norm(x)), where the mixer is Llama's attention
(with a `partial_rotary_factor`, 0.5 in Bamba-9B) or Mamba2's (vjx/models/layers/mamba_mixer.py).
The two kinds keep different caches: the attention layers a KV cache group of full-attention
blocks, the Mamba layers a group of state slots (`MambaSpec`), under the hybrid allocator.
The checkpoint's `final_layernorm` is vjx's final `norm`.
"""

from typing import Any, ClassVar

from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.decoder import BuildContext, DecoderArgs
from vjx.models.layers.mamba_mixer import MambaArgs, MambaMixer2
from vjx.models.layers.norm import RMSNorm
from vjx.models.llama import LlamaForCausalLM


class BambaDecoderLayer(nnx.Module):
    """x + mixer(norm(x)), then x + feed_forward(norm(x)); the mixer, attention at `self_attn`
    or Mamba2 at `mamba`, keeps the layer's cache (`cache_module`)."""

    def __init__(self, args: DecoderArgs, mixer_name: str, mixer: nnx.Module, feed_forward: nnx.Module, *, dtype):
        self.input_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps, dtype=dtype)
        setattr(self, mixer_name, mixer)
        self.cache_module = mixer_name
        self.pre_ff_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps, dtype=dtype)
        self.feed_forward = feed_forward

    def __call__(
        self, x: Float[Array, "T D"], positions: Int[Array, " T"], kv_cache: Array, md: AttentionMetadata
    ) -> tuple[Float[Array, "T D"], Array]:
        out, kv_cache = getattr(self, self.cache_module)(self.input_layernorm(x), positions, kv_cache, md)
        x = x + out
        return x + self.feed_forward(self.pre_ff_layernorm(x)), kv_cache


def bamba_mamba_args(config: Any) -> MambaArgs:
    """The Mamba layers' shape from Bamba's `mamba_*` fields."""
    if config.mamba_expand * config.hidden_size != config.mamba_n_heads * config.mamba_d_head:
        raise ValueError(
            f"mamba_n_heads * mamba_d_head ({config.mamba_n_heads} * {config.mamba_d_head}) must equal "
            f"mamba_expand * hidden_size ({config.mamba_expand} * {config.hidden_size})."
        )
    if config.hidden_act != "silu":
        raise ValueError(f"hidden_act must be 'silu' for Bamba's Mamba layers, got {config.hidden_act!r}.")
    return MambaArgs(
        hidden_size=config.hidden_size,
        num_heads=config.mamba_n_heads,
        head_dim=config.mamba_d_head,
        n_groups=config.mamba_n_groups,
        state_size=config.mamba_d_state,
        conv_kernel=config.mamba_d_conv,
        chunk_size=config.mamba_chunk_size,
        use_bias=config.mamba_proj_bias,
        use_conv_bias=config.mamba_conv_bias,
        norm_eps=config.rms_norm_eps,
        time_step_limit=tuple(config.time_step_limit),
    )


class BambaForCausalLM(LlamaForCausalLM):
    CHECKPOINT_SUBSTRINGS: ClassVar[dict[str, str]] = {"model.final_layernorm.": "model.norm."}

    def make_layer(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        layer_type = ctx.hf_config.layer_types[layer_idx]
        if layer_type == "full_attention":
            name, mixer = "self_attn", self.make_attention(ctx, layer_idx)
        elif layer_type == "linear_attention":
            name, mixer = "mamba", MambaMixer2(bamba_mamba_args(ctx.hf_config), dtype=ctx.dtype, rngs=ctx.rngs)
        else:
            raise ValueError(f"layer_types must hold 'full_attention' or 'linear_attention', got {layer_type!r}.")
        return BambaDecoderLayer(ctx.args, name, mixer, self.make_mlp(ctx, layer_idx), dtype=ctx.dtype)
