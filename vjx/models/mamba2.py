"""Mamba2 (Mamba-Codestral, state-spaces/mamba2-*) as a Flax NNX module: every layer a
state-space mixer, no attention and no MLP.

Legend: T tokens, D hidden.

Pre-norm blocks x + mixer(norm(x)) (vjx/models/layers/mamba_mixer.py) on the shared decoder
skeleton; the checkpoint's `backbone.` is vjx's `model.`, its `embeddings` (older exports:
`embedding`) the `embed_tokens`, its `norm_f` the final `norm`. With `residual_in_fp32` the
residual add runs in float32 (transformers keeps the whole residual stream in float32; vjx
rounds it to the model dtype after each add).
"""

from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.decoder import BuildContext, DecoderArgs, DecoderForCausalLM
from vjx.models.layers.mamba_mixer import MambaArgs, MambaMixer2
from vjx.models.layers.norm import RMSNorm


class Mamba2DecoderLayer(nnx.Module):
    """x + mixer(norm(x)); the mixer keeps the layer's state slots."""

    cache_module = "mixer"

    def __init__(self, args: MambaArgs, *, residual_in_fp32: bool, dtype, rngs: nnx.Rngs):
        self.norm = RMSNorm(args.hidden_size, eps=args.norm_eps, dtype=dtype)
        self.mixer = MambaMixer2(args, dtype=dtype, rngs=rngs)
        self.residual_in_fp32 = residual_in_fp32

    def __call__(
        self, x: Float[Array, "T D"], positions: Int[Array, " T"], kv_cache: Array, md: AttentionMetadata
    ) -> tuple[Float[Array, "T D"], Array]:
        out, kv_cache = self.mixer(self.norm(x), positions, kv_cache, md)
        if self.residual_in_fp32:
            return (x.astype(jnp.float32) + out.astype(jnp.float32)).astype(x.dtype), kv_cache
        return x + out, kv_cache


class Mamba2ForCausalLM(DecoderForCausalLM):
    CHECKPOINT_PREFIXES: ClassVar[dict[str, str | None]] = {"backbone.": "model."}
    CHECKPOINT_SUBSTRINGS: ClassVar[dict[str, str]] = {
        "model.embeddings.": "model.embed_tokens.",
        "model.embedding.": "model.embed_tokens.",
        "model.norm_f.": "model.norm.",
    }

    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        return DecoderArgs(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.num_heads * hf_config.head_dim,
            num_layers=hf_config.num_hidden_layers,
            num_heads=hf_config.num_heads,
            num_kv_heads=hf_config.num_heads,
            head_dim=hf_config.head_dim,
            rms_norm_eps=hf_config.layer_norm_epsilon,
            tie_word_embeddings=getattr(hf_config, "tie_word_embeddings", False),
        )

    def make_layer(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        config = ctx.hf_config
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' for a Mamba2 model, got {config.hidden_act!r}.")
        args = MambaArgs(
            hidden_size=config.hidden_size,
            num_heads=config.num_heads,
            head_dim=config.head_dim,
            n_groups=config.n_groups,
            state_size=config.state_size,
            conv_kernel=config.conv_kernel,
            chunk_size=config.chunk_size,
            use_bias=config.use_bias,
            use_conv_bias=config.use_conv_bias,
            norm_eps=config.layer_norm_epsilon,
            time_step_limit=tuple(config.time_step_limit),
        )
        residual_in_fp32 = getattr(config, "residual_in_fp32", True)
        return Mamba2DecoderLayer(args, residual_in_fp32=residual_in_fp32, dtype=ctx.dtype, rngs=ctx.rngs)
