"""Llama-family causal LM (Llama 2/3, SmolLM2, Mistral) as a Flax NNX module.

Legend: T tokens, R rows whose logits are wanted, D hidden, N query heads, K kv heads,
H head dim, F MLP width, V vocab.

Module attribute paths follow Hugging Face's parameter names (`model.layers.0.self_attn.
o_proj`), so the loader maps a checkpoint tensor to its param by name alone; the fused
`qkv_proj` and `gate_up_proj` (vLLM's names) are filled from the `q_proj`, `k_proj`,
`v_proj` and `gate_proj`, `up_proj` tensors beside them. Compute runs
in the model dtype; norms and the attention softmax run in float32, as in HF.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.backend import AttentionBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec
from vjx.models.layers.linear import Embedding, Linear, MergedLinear, QKVLinear
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.rotary import RotaryEmbedding
from vjx.sharding.constraints import constrain

_ACTIVATIONS = {"silu": jax.nn.silu}


@dataclasses.dataclass(frozen=True)
class LlamaArgs:
    """The hyperparameters the module reads from a `transformers` Llama/Mistral config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    sliding_window: int | None

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> "LlamaArgs":
        num_heads = hf_config.num_attention_heads
        hidden_act = getattr(hf_config, "hidden_act", "silu")
        if hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(_ACTIVATIONS)}, got {hidden_act!r}.")
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
            rms_norm_eps=hf_config.rms_norm_eps,
            hidden_act=hidden_act,
            attention_bias=getattr(hf_config, "attention_bias", False),
            mlp_bias=getattr(hf_config, "mlp_bias", False),
            tie_word_embeddings=getattr(hf_config, "tie_word_embeddings", False),
            sliding_window=getattr(hf_config, "sliding_window", None),
        )


class LlamaAttention(nnx.Module):
    """GQA self-attention; the backend owns the KV cache layout, the write and the kernel."""

    def __init__(self, args: LlamaArgs, rotary: RotaryEmbedding, *, dtype, backend, rngs):
        D, N, K, H = args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim
        kwargs = dict(use_bias=args.attention_bias, dtype=dtype, rngs=rngs)
        self.qkv_proj = QKVLinear(D, N, K, H, **kwargs)
        self.o_proj = Linear("TNH,NHD->TD", (N, H, D), ("heads", "head_dim", "embed"), **kwargs)
        self.rotary = rotary
        self.backend = backend
        self.sm_scale = H**-0.5
        self.head_dim = H
        self.sliding_window = args.sliding_window

    def __call__(
        self,
        x: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        q_TNH, k_TKH, v_TKH = self.qkv_proj(x)
        q_TNH = self.rotary(q_TNH, positions)
        k_TKH = self.rotary(k_TKH, positions)
        out_TNH, kv_cache = self.backend.forward(
            q_TNH,
            k_TKH,
            v_TKH,
            kv_cache,
            md,
            sm_scale=self.sm_scale,
            sliding_window=self.sliding_window,
        )
        return self.o_proj(out_TNH), kv_cache

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> KVCacheSpec:
        """What this layer keeps per token; `num_kv_heads` counts the heads the cache holds."""
        head = dict(num_kv_heads=num_kv_heads, head_size=self.head_dim, dtype=dtype)
        if self.sliding_window is None:
            return FullAttentionSpec(block_size, **head)
        return SlidingWindowSpec(block_size, **head, sliding_window=self.sliding_window)


class LlamaMLP(nnx.Module):
    """SwiGLU: down(act(gate(x)) * up(x)), gate and up in one GEMM."""

    def __init__(self, args: LlamaArgs, *, dtype, rngs):
        D, F = args.hidden_size, args.intermediate_size
        kwargs = dict(use_bias=args.mlp_bias, dtype=dtype, rngs=rngs)
        self.gate_up_proj = MergedLinear(("gate_proj", "up_proj"), D, F, ("embed", "mlp"), **kwargs)
        self.down_proj = Linear("TF,FD->TD", (F, D), ("mlp", "embed"), **kwargs)
        self.hidden_act = args.hidden_act

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T D"]:
        act = _ACTIVATIONS[self.hidden_act]
        gate_TF, up_TF = self.gate_up_proj(x)
        return self.down_proj(act(gate_TF) * up_TF)


class LlamaDecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, args: LlamaArgs, rotary: RotaryEmbedding, *, dtype, backend, rngs):
        eps = args.rms_norm_eps
        self.input_layernorm = RMSNorm(args.hidden_size, eps=eps, dtype=dtype)
        self.self_attn = LlamaAttention(args, rotary, dtype=dtype, backend=backend, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, eps=eps, dtype=dtype)
        self.mlp = LlamaMLP(args, dtype=dtype, rngs=rngs)

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


class LlamaModel(nnx.Module):
    """Embedding, the decoder layers (one KV cache array each) and the final norm."""

    def __init__(self, args: LlamaArgs, rotary: RotaryEmbedding, *, dtype, backend, rngs):
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = nnx.List(
            [LlamaDecoderLayer(args, rotary, dtype=dtype, backend=backend, rngs=rngs) for _ in range(args.num_layers)]
        )
        self.norm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps, dtype=dtype)

    def __call__(
        self,
        input_ids: Int[Array, " T"],
        positions: Int[Array, " T"],
        kv_caches: list[Array],
        attn_metadata: list[AttentionMetadata],
    ) -> tuple[Float[Array, "T D"], list[Array]]:
        # The residual stream is pinned at every layer boundary (whole on each device under
        # tensor parallelism), so each row-parallel projection ends in one all-reduce.
        x = constrain(self.embed_tokens(input_ids), ("tokens", "embed"))
        new_caches = []
        for layer, kv_cache, md in zip(self.layers, kv_caches, attn_metadata, strict=True):
            x, kv_cache = layer(x, positions, kv_cache, md)
            x = constrain(x, ("tokens", "embed"))
            new_caches.append(kv_cache)
        return self.norm(x), new_caches


class LlamaForCausalLM(nnx.Module):
    """The runner's model: `__call__` gives final hidden states, `compute_logits` the logits.

    `backend` is kept as a static field of the graph definition, so it must be hashable (a
    frozen dataclass); the KV caches are arguments and return values, never module state.
    """

    def __init__(self, hf_config: Any, *, dtype, backend: AttentionBackend, rngs: nnx.Rngs):
        args = LlamaArgs.from_hf_config(hf_config)
        dtype = jnp.dtype(dtype)
        rotary = RotaryEmbedding.from_hf_config(hf_config, args.head_dim)
        self.model = LlamaModel(args, rotary, dtype=dtype, backend=backend, rngs=rngs)
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

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> dict[str, KVCacheSpec]:
        """Each attention layer's KV cache spec, by layer name, in layer order."""
        return {
            f"model.layers.{i}.self_attn": layer.self_attn.get_kv_cache_spec(block_size, num_kv_heads, dtype)
            for i, layer in enumerate(self.model.layers)
        }

    def compute_logits(self, hidden: Float[Array, "R D"]) -> Float[Array, "R V"]:
        """float32 logits; computed in the model dtype and then upcast, as HF does.

        They stay split over the vocabulary like the LM head (each device computes its part of
        every row), so a caller that wants whole rows gathers logits, never the head."""
        if self.lm_head is None:
            logits = self.model.embed_tokens.attend(hidden)
        else:
            logits = self.lm_head(hidden)
        return constrain(logits, ("tokens", "vocab")).astype(jnp.float32)
