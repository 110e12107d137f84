"""EAGLE's draft head for a Llama target, in the published EAGLE-1 layout (vLLM's
`EagleLlamaForCausalLM`; e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B).

Legend: T tokens, D hidden.

The head reads, for each position p, the embedding of the token at p + 1 and the target's
final hidden state at p, concatenated; `fc` [2D -> D] maps them into the residual stream of
Llama decoder layers (the first without its input norm), whose output is the next draft's
hidden state, turned into logits by the target's LM head. The checkpoint holds `fc.weight` and
`layers.{i}.*`; the embedding and the LM head are the target's, so copies a checkpoint holds
(`embed_tokens.weight`, `lm_head.weight`) are skipped.
"""

from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.backend import AttentionBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.kv_cache_interface import KVCacheSpec
from vjx.models.layers.decoder import BuildContext, DecoderArgs
from vjx.models.layers.linear import Linear
from vjx.models.llama import LlamaForCausalLM
from vjx.sharding.constraints import constrain, replicate


class _NoNorm(nnx.Module):
    """EAGLE's first layer has no input norm: its input is `fc`'s output as it is."""

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T D"]:
        return x


class EagleLlamaForCausalLM(nnx.Module):
    CHECKPOINT_PREFIXES: ClassVar[dict[str, str | None]] = {
        "embed_tokens.": None,
        "lm_head.": None,
        "model.embed_tokens.": None,
        "model.": "",
    }
    CHECKPOINT_SUBSTRINGS: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        hf_config: Any,
        *,
        dtype,
        backend: AttentionBackend,
        rngs: nnx.Rngs,
        max_model_len: int | None = None,
        enable_expert_parallel: bool = False,
    ):
        args = DecoderArgs.from_hf_config(hf_config)
        ctx = BuildContext(hf_config, args, jnp.dtype(dtype), backend, rngs, max_model_len, enable_expert_parallel)
        self.fc = Linear(
            "TE,ED->TD",
            (2 * args.hidden_size, args.hidden_size),
            (None, "embed"),
            use_bias=False,
            dtype=ctx.dtype,
            rngs=rngs,
        )
        builder = LlamaForCausalLM.__new__(LlamaForCausalLM)
        self.layers = nnx.List([builder.make_layer(ctx, i) for i in range(args.num_layers)])
        self.layers[0].input_layernorm = _NoNorm()
        self.target_hidden_size = args.hidden_size

    def combine_hidden_states(self, target_hidden: Float[Array, "T D"]) -> Float[Array, "T D"]:
        """The target's final hidden states, as the head reads them (unchanged)."""
        return target_hidden

    def __call__(
        self,
        embeds: Float[Array, "T D"],
        target_hidden: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
    ) -> tuple[Float[Array, "T D"], list[Array]]:
        """The next drafts' hidden states (the residual stream, unnormalized) and the caches."""
        x = self.fc(jnp.concatenate([embeds, target_hidden.astype(embeds.dtype)], axis=-1))
        x = constrain(x, ("tokens", "embed"))
        new_caches = []
        for layer, kv_cache, md in zip(self.layers, kv_caches, attn_metadata, strict=True):
            x, kv_cache = layer(x, positions, kv_cache, md)
            x = constrain(x, ("tokens", "embed"))
            new_caches.append(kv_cache)
        return x, new_caches

    def draft_tokens(self, target: nnx.Module, hidden: Float[Array, "R D"]) -> Int[Array, " R"]:
        """The greedy draft after each row's hidden state: the target's LM head reads it."""
        return jnp.argmax(replicate(target.compute_logits(hidden)), axis=-1).astype(jnp.int32)

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> dict[str, KVCacheSpec]:
        return {
            f"layers.{i}.self_attn": layer.self_attn.get_kv_cache_spec(block_size, num_kv_heads, dtype)
            for i, layer in enumerate(self.layers)
        }
