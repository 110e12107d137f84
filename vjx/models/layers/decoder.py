"""The skeleton every dense decoder family shares: embedding, a stack of decoder layers (one
KV cache array each), the final norm, and the LM head.

Legend: T tokens, R rows whose logits are wanted, D hidden, V vocab.

Module attribute paths follow Hugging Face's parameter names (`model.embed_tokens`,
`model.layers.0...`, `model.norm`, `lm_head`), so the loader maps a checkpoint tensor to its
param by name alone. A family file builds its own layers and norms and hands them in; what
differs at the ends (an embedding scale, logit soft-capping or scaling) is a field here.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.backend import AttentionBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.kv_cache_interface import KVCacheSpec
from vjx.models.layers.linear import Embedding, Linear
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.rotary import RotaryEmbedding
from vjx.sharding.constraints import constrain


@dataclasses.dataclass(frozen=True)
class DecoderArgs:
    """The sizes every family reads from its `transformers` config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> "DecoderArgs":
        num_heads = hf_config.num_attention_heads
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
            rms_norm_eps=hf_config.rms_norm_eps,
            tie_word_embeddings=getattr(hf_config, "tie_word_embeddings", False),
        )


class DecoderModel(nnx.Module):
    """Embedding (times `embed_scale`), the layers built by `make_layer(i)`, the final norm."""

    def __init__(
        self,
        args: DecoderArgs,
        make_layer: Callable[[int], nnx.Module],
        norm: nnx.Module,
        *,
        embed_scale: float = 1.0,
        dtype,
        rngs,
    ):
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([make_layer(i) for i in range(args.num_layers)])
        self.norm = norm
        self.embed_scale = embed_scale

    def __call__(
        self,
        input_ids: Int[Array, " T"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
    ) -> tuple[Float[Array, "T D"], list[Array]]:
        x, new_caches = self.run_layers(self.embed(input_ids), positions, kv_caches, attn_metadata)
        return self.norm(x), new_caches

    def embed(self, input_ids: Int[Array, " T"]) -> Float[Array, "T D"]:
        x = self.embed_tokens(input_ids)
        if self.embed_scale != 1.0:
            # Rounded to the model dtype first, as HF's scaled embeddings do.
            x = x * jnp.asarray(np.float32(self.embed_scale), x.dtype)
        # The residual stream is pinned at every layer boundary (whole on each device under
        # tensor parallelism), so each row-parallel projection ends in one all-reduce.
        return constrain(x, ("tokens", "embed"))

    def run_layers(
        self,
        x: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
        layers: range | None = None,
    ) -> tuple[Float[Array, "T D"], list[Array]]:
        """The residual stream through `layers` (default: all; a pipeline stage runs its own),
        with one KV cache and metadata per layer run."""
        layers = range(len(self.layers)) if layers is None else layers
        new_caches = []
        for i, kv_cache, md in zip(layers, kv_caches, attn_metadata, strict=True):
            x, kv_cache = self.layers[i](x, positions, kv_cache, md)
            x = constrain(x, ("tokens", "embed"))
            new_caches.append(kv_cache)
        return x, new_caches


@dataclasses.dataclass(frozen=True)
class LogitsArgs:
    """How final hidden states become logits beyond the LM head."""

    divisor: float = 1.0
    """The logits are divided by it (Granite's `logits_scaling`)."""
    soft_cap: float | None = None
    """Logits become soft_cap * tanh(logits / soft_cap) (Gemma's final soft-capping)."""


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a family's builder hooks read while the model is constructed."""

    hf_config: Any
    """The language model's `transformers` config."""
    args: DecoderArgs
    dtype: jnp.dtype
    backend: AttentionBackend
    rngs: nnx.Rngs
    max_model_len: int | None
    """The engine's context length (None: the model's); LongRoPE picks its factors by it."""
    expert_parallel: bool = False
    """MoE layers put whole experts on each device (vLLM's `enable_expert_parallel`)."""

    def rotary(self, layer_type: str | None = None) -> RotaryEmbedding:
        return RotaryEmbedding.from_hf_config(
            self.hf_config, self.args.head_dim, layer_type=layer_type, max_model_len=self.max_model_len
        )


class DecoderForCausalLM(nnx.Module):
    """The runner's model: `__call__` gives final hidden states, `compute_logits` the logits.

    A family subclasses it and defines `make_layer(ctx, layer_idx)`, which returns decoder
    layer `layer_idx` (`(x, positions, kv_cache, md) -> (x, kv_cache)`, its attention at
    `.self_attn`), and overrides `make_norm`, `embed_scale` and `make_logits_args` where it
    differs from the defaults. Each attention layer sits at `model.layers.{i}.self_attn`. `backend` is kept as
    a static field of the graph definition, so it must be hashable (a frozen dataclass); the
    KV caches are arguments and return values, never module state.
    """

    CHECKPOINT_PREFIXES: ClassVar[dict[str, str | None]] = {}
    """Checkpoint tensor name prefixes the loader renames (to the given prefix) or skips
    (None): for checkpoints whose language model sits under another path."""
    CHECKPOINT_SUBSTRINGS: ClassVar[dict[str, str]] = {}
    """Parts of checkpoint tensor names the loader renames wherever they occur (vLLM's
    `WeightsMapper.orig_to_new_substr`): for a module the family names differently."""

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
        # The language model's config: `hf_config` itself, unless multimodal (Gemma 3).
        text_config = hf_config.get_text_config()
        args = self.decoder_args(text_config)
        dtype = jnp.dtype(dtype)
        ctx = BuildContext(text_config, args, dtype, backend, rngs, max_model_len, enable_expert_parallel)
        norm = self.make_norm(ctx, args.hidden_size)
        embed_scale = self.embed_scale(ctx)
        self.model = DecoderModel(
            args, lambda i: self.make_layer(ctx, i), norm, embed_scale=embed_scale, dtype=dtype, rngs=rngs
        )
        self.lm_head = (
            None
            if args.tie_word_embeddings
            else Linear(
                "RD,DV->RV",
                (args.hidden_size, args.vocab_size),
                ("embed", "vocab"),
                use_bias=False,
                dtype=dtype,
                rngs=rngs,
            )
        )
        self.logits_args = self.make_logits_args(ctx)

    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        """The family's sizes, for a config whose fields have other names than Llama's."""
        return DecoderArgs.from_hf_config(hf_config)

    def make_norm(self, ctx: BuildContext, num_features: int) -> nnx.Module:
        """The family's RMSNorm over `num_features` (the final norm uses it too)."""
        return RMSNorm(num_features, eps=ctx.args.rms_norm_eps, dtype=ctx.dtype)

    def embed_scale(self, ctx: BuildContext) -> float:
        return 1.0

    def make_logits_args(self, ctx: BuildContext) -> LogitsArgs:
        return LogitsArgs()

    def __call__(
        self,
        input_ids: Int[Array, " T"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
    ) -> tuple[Float[Array, "T D"], list[Array]]:
        """Runs the step's tokens; returns final hidden states and the updated caches.
        `kv_caches` and `attn_metadata` have one entry per layer (a layer's metadata is its
        KV cache group's)."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def forward_with_aux_hidden_states(
        self,
        input_ids: Int[Array, " T"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
        aux_layers: tuple[int, ...],
    ) -> tuple[Float[Array, "T D"], list[Array], Float[Array, "T E"]]:
        """`__call__`, plus the residual stream entering each of `aux_layers` (ascending; the
        number of layers means the last layer's output), concatenated [T, len(aux_layers) * D]:
        what an EAGLE-3 head reads."""
        decoder, x = self.model, self.model.embed(input_ids)
        new_caches, aux, start = [], [], 0
        for end in (*aux_layers, len(decoder.layers)):
            x, caches = decoder.run_layers(
                x, positions, kv_caches[start:end], attn_metadata[start:end], range(start, end)
            )
            new_caches += caches
            aux.append(x)
            start = end
        return decoder.norm(x), new_caches, jnp.concatenate(aux[:-1], axis=-1)

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> dict[str, KVCacheSpec]:
        """Each layer's cache spec, by the name of the module that keeps the cache (the
        attention, `self_attn`, unless the layer's `cache_module` names another, as a Mamba
        layer's mixer), in layer order."""
        specs = {}
        for i, layer in enumerate(self.model.layers):
            name = getattr(layer, "cache_module", "self_attn")
            specs[f"model.layers.{i}.{name}"] = getattr(layer, name).get_kv_cache_spec(block_size, num_kv_heads, dtype)
        return specs

    def compute_logits(self, hidden: Float[Array, "R D"]) -> Float[Array, "R V"]:
        """float32 logits; the head runs in the model dtype and is then upcast, as HF does.

        They stay split over the vocabulary like the LM head (each device computes its part of
        every row), so a caller that wants whole rows gathers logits, never the head."""
        if self.lm_head is None:
            logits = self.model.embed_tokens.attend(hidden)
        else:
            logits = self.lm_head(hidden)
        logits = constrain(logits, ("tokens", "vocab")).astype(jnp.float32)
        if self.logits_args.divisor != 1.0:
            logits = logits / self.logits_args.divisor
        if self.logits_args.soft_cap is not None:
            logits = self.logits_args.soft_cap * jnp.tanh(logits / self.logits_args.soft_cap)
        return logits
