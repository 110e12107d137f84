"""EAGLE-3's draft head for a Llama target, in the published layout (vLLM's
`Eagle3LlamaForCausalLM`; e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).

Legend: T tokens, D hidden, A auxiliary hidden states, V draft vocabulary.

The target hands the head its residual stream at A layers (`aux_hidden_state_layer_ids`;
layer i's is the stream entering layer i, the last layer's output for i = num layers),
concatenated; `fc` [A*D -> D] combines them. Its first layer reads, for each position p, the
embedding of the token at p + 1 and that hidden state, each normed (`input_layernorm`,
`hidden_norm`), concatenated into its attention ([2D] in), with the hidden state as the
residual; later layers are plain Llama layers. The output before the final `norm` is the next
draft's hidden state (the k - 1 drafts after the first feed it back without `fc`); after it,
the head's own LM head gives logits over its draft vocabulary, whose ids `d2t` maps to the
target's (target id = draft id + d2t[draft id]). The embedding is the target's: a copy the
checkpoint holds is skipped, as is `t2d`.
"""

from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.backend import AttentionBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.kv_cache_interface import KVCacheSpec
from vjx.models.layers.decoder import BuildContext, DecoderArgs
from vjx.models.layers.linear import Linear, QKVLinear
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.param import HFParamLayer, logical_param
from vjx.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vjx.sharding.constraints import constrain, replicate

_REFUSED_OPTIONS = ("norm_before_fc", "fc_norm", "norm_output")
"""Variants of the head that vjx does not build (each a flag of the config or its `eagle_config`)."""


def eagle_config_value(hf_config: Any, key: str, default=None):
    """A head option, from the config or its `eagle_config` dict (the published checkpoints
    use both)."""
    eagle_config = getattr(hf_config, "eagle_config", None) or {}
    value = getattr(hf_config, key, None)
    return eagle_config.get(key, default) if value is None else value


def aux_hidden_state_layer_ids(hf_config: Any, target_num_layers: int) -> tuple[int, ...]:
    """The target layers whose incoming residual stream the head reads, ascending: the
    config's `eagle_aux_hidden_state_layer_ids`, else vLLM's default (2, L // 2, L - 3)."""
    ids = eagle_config_value(hf_config, "eagle_aux_hidden_state_layer_ids")
    if not ids:
        ids = (2, target_num_layers // 2, target_num_layers - 3)
    return tuple(sorted(set(ids)))


def num_aux_hidden_states(hf_config: Any) -> int:
    """A, the hidden states `fc` takes: the config's count, else its layer ids', else 3."""
    count = getattr(hf_config, "num_aux_hidden_states", None)
    ids = eagle_config_value(hf_config, "eagle_aux_hidden_state_layer_ids")
    return count or (len(ids) if ids else 3)


def verify_eagle3_head(hf_config: Any, target_num_layers: int) -> None:
    """Raises ValueError for a head vjx does not build or whose target layers do not fit."""
    for key in _REFUSED_OPTIONS:
        if eagle_config_value(hf_config, key, False):
            raise ValueError(f"speculative_config EAGLE-3 head with {key}=true is not supported by vjx yet.")
    if not eagle_config_value(hf_config, "use_aux_hidden_state", True):
        raise ValueError("speculative_config EAGLE-3 head with use_aux_hidden_state=false is not supported yet.")
    ids = aux_hidden_state_layer_ids(hf_config, target_num_layers)
    if ids[0] < 0 or ids[-1] > target_num_layers or len(ids) != num_aux_hidden_states(hf_config):
        raise ValueError(
            f"speculative_config EAGLE-3 head reads target layers {list(ids)} (eagle_aux_hidden_state_layer_ids): "
            f"it needs {num_aux_hidden_states(hf_config)} distinct ids in [0, {target_num_layers}] for a target "
            f"of {target_num_layers} layers."
        )


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """The first layer: attention over [input_layernorm(embedding); hidden_norm(hidden)]."""

    def __init__(self, args: DecoderArgs, self_attn, mlp: nnx.Module, *, dtype, norm_before_residual: bool):
        super().__init__(args, self_attn, mlp, dtype=dtype)
        self.hidden_norm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps, dtype=dtype)
        self.norm_before_residual = norm_before_residual

    def __call__(
        self,
        embeds: Float[Array, "T D"],
        hidden: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        normed = self.hidden_norm(hidden)
        x = jnp.concatenate([self.input_layernorm(embeds), normed], axis=-1)
        attn_out, kv_cache = self.self_attn(x, positions, kv_cache, md)
        x = (normed if self.norm_before_residual else hidden) + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv_cache


class DraftVocabMap(nnx.Module, HFParamLayer):
    """`d2t`: per draft token id, the offset to its target id [V] (int32)."""

    HF_NAMES = {"offsets": "offsets"}

    def __init__(self, draft_vocab_size: int):
        self.offsets = logical_param(jnp.zeros((draft_vocab_size,), jnp.int32), (None,))

    def __call__(self, draft_ids: Int[Array, " R"], target_vocab_size: int) -> Int[Array, " R"]:
        # Kept within the target's vocabulary whatever the table holds (random dummy weights).
        return (draft_ids + self.offsets[...][draft_ids]) % target_vocab_size


class Eagle3LlamaForCausalLM(nnx.Module):
    CHECKPOINT_PREFIXES: ClassVar[dict[str, str | None]] = {
        "embed_tokens.": None,
        "model.embed_tokens.": None,
        "t2d": None,
        "d2t": "draft_id_to_target_id.offsets",
        "midlayer.": "layers.0.",
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
        D = args.hidden_size
        self.target_hidden_size = num_aux_hidden_states(hf_config) * D
        self.fc = Linear(
            "TE,ED->TD", (self.target_hidden_size, D), (None, "embed"), use_bias=False, dtype=ctx.dtype, rngs=rngs
        )
        self.layers = nnx.List([self._make_layer(ctx, i) for i in range(args.num_layers)])
        self.norm = RMSNorm(D, eps=args.rms_norm_eps, dtype=ctx.dtype)
        draft_vocab_size = getattr(hf_config, "draft_vocab_size", None) or args.vocab_size
        self.lm_head = Linear(
            "RD,DV->RV", (D, draft_vocab_size), ("embed", "vocab"), use_bias=False, dtype=ctx.dtype, rngs=rngs
        )
        self.draft_id_to_target_id = DraftVocabMap(draft_vocab_size) if draft_vocab_size != args.vocab_size else None
        self.vocab_size = args.vocab_size

    @staticmethod
    def _make_layer(ctx: BuildContext, layer_idx: int) -> nnx.Module:
        builder = LlamaForCausalLM.__new__(LlamaForCausalLM)
        if layer_idx:
            return builder.make_layer(ctx, layer_idx)
        attention, args = builder.make_attention(ctx, 0), ctx.args
        bias = getattr(ctx.hf_config, "attention_bias", False)
        attention.qkv_proj = QKVLinear(
            2 * args.hidden_size,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            use_bias=bias,
            dtype=ctx.dtype,
            rngs=ctx.rngs,
        )
        norm_before_residual = bool(eagle_config_value(ctx.hf_config, "norm_before_residual", False))
        return Eagle3DecoderLayer(
            args, attention, builder.make_mlp(ctx, 0), dtype=ctx.dtype, norm_before_residual=norm_before_residual
        )

    def combine_hidden_states(self, target_hidden: Float[Array, "T E"]) -> Float[Array, "T D"]:
        """The target's A hidden states, concatenated, as one: `fc`'s output."""
        return constrain(self.fc(target_hidden), ("tokens", "embed"))

    def __call__(
        self,
        embeds: Float[Array, "T D"],
        hidden: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
    ) -> tuple[Float[Array, "T D"], list[Array]]:
        """The next drafts' hidden states (before the final norm) and the caches."""
        x, kv_cache = self.layers[0](embeds, hidden.astype(embeds.dtype), positions, kv_caches[0], attn_metadata[0])
        x, new_caches = constrain(x, ("tokens", "embed")), [kv_cache]
        for layer, kv_cache, md in zip(self.layers[1:], kv_caches[1:], attn_metadata[1:], strict=True):
            x, kv_cache = layer(x, positions, kv_cache, md)
            x = constrain(x, ("tokens", "embed"))
            new_caches.append(kv_cache)
        return x, new_caches

    def draft_tokens(self, target: nnx.Module, hidden: Float[Array, "R D"]) -> Int[Array, " R"]:
        """The greedy draft after each row's hidden state, as a target token id."""
        logits = replicate(constrain(self.lm_head(self.norm(hidden)), ("tokens", "vocab")).astype(jnp.float32))
        draft_ids = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        if self.draft_id_to_target_id is None:
            return draft_ids
        return self.draft_id_to_target_id(draft_ids, self.vocab_size)

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> dict[str, KVCacheSpec]:
        return {
            f"layers.{i}.self_attn": layer.self_attn.get_kv_cache_spec(block_size, num_kv_heads, dtype)
            for i, layer in enumerate(self.layers)
        }
