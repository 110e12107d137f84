"""Self-attention of a decoder layer: fused q/k/v projection, RoPE, the backend's paged
attention, output projection.

Legend: T tokens, D hidden, N query heads, K kv heads, H head dim.

Families differ in a few places, each a field or a hook here rather than a branch: biases,
the softmax scale, a sliding window, tanh soft-capping of the scores, attention sinks (fields
of `AttentionArgs`), q/k normalization before RoPE (`normalize_qk`, overridden by the families
that have it), and whether the checkpoint already fuses q/k/v (`QKV_LINEAR`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec
from vjx.models.layers.linear import Linear, QKVLinear
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.param import HFParamLayer, logical_param
from vjx.models.layers.rotary import RotaryEmbedding


@dataclasses.dataclass(frozen=True)
class AttentionArgs:
    """One attention layer's shape and scoring."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sm_scale: float
    """Factor on q.k before soft-capping and the softmax."""
    qkv_bias: bool = False
    o_bias: bool = False
    sliding_window: int | None = None
    """Keys each query sees, itself included; None: every earlier key."""
    soft_cap: float | None = None
    """Scores become soft_cap * tanh(score / soft_cap); None: no capping."""
    rms_norm_eps: float = 1e-6
    """Epsilon of the q/k norms, in the families that have them."""
    sinks: bool = False
    """A learned sink logit per query head joins the softmax (gpt-oss's `self_attn.sinks`)."""


def layer_sliding_window(hf_config: Any, layer_idx: int) -> int | None:
    """Layer `layer_idx`'s window, as transformers reads it: `sliding_window` on the layers
    `layer_types` marks "sliding_attention", or on every layer of a config without
    `layer_types` (Mistral, Phi-3)."""
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    return getattr(hf_config, "sliding_window", None)


class Attention(nnx.Module, HFParamLayer):
    """GQA self-attention; the backend owns the KV cache layout, the write and the kernel.

    Its own params are vLLM's per-tensor scales of an fp8 KV cache (which stores k / k_scale
    and v / v_scale), float32 scalars that calibrated checkpoints carry as `self_attn.k_scale`
    (or, as ModelOpt and older llm-compressor write them, `self_attn.k_proj.k_scale` and
    `self_attn.k_proj.output_scale`) and others lack: None then, which means 1.0. A cache of
    any other dtype ignores them, as in vLLM. With `AttentionArgs.sinks` it also holds the
    heads' sink logits [N]."""

    QKV_LINEAR: ClassVar[type[QKVLinear]] = QKVLinear
    HF_NAMES = {
        "k_scale": "k_scale",
        "v_scale": "v_scale",
        "k_proj.k_scale": "k_scale",
        "v_proj.v_scale": "v_scale",
        "k_proj.output_scale": "k_scale",
        "v_proj.output_scale": "v_scale",
        "sinks": "sinks",
    }
    OPTIONAL_HF_NAMES = frozenset(HF_NAMES) - {"sinks"}

    def __init__(self, args: AttentionArgs, rotary: RotaryEmbedding, *, dtype, backend, rngs):
        D, N, K, H = args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim
        self.qkv_proj = self.QKV_LINEAR(D, N, K, H, use_bias=args.qkv_bias, dtype=dtype, rngs=rngs)
        self.o_proj = Linear(
            "TNH,NHD->TD", (N, H, D), ("heads", "head_dim", "embed"), use_bias=args.o_bias, dtype=dtype, rngs=rngs
        )
        self.rotary = rotary
        self.backend = backend
        self.head_dim = H
        self.sm_scale = args.sm_scale
        self.sliding_window = args.sliding_window
        self.soft_cap = args.soft_cap
        self.k_scale = nnx.Param(None, out_sharding=(), eager_sharding=False)
        self.v_scale = nnx.Param(None, out_sharding=(), eager_sharding=False)
        self.sinks = logical_param(jnp.zeros((N,), dtype), ("heads",)) if args.sinks else None

    def __call__(
        self,
        x: Float[Array, "T E"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        """`x` is the layer's normed input (E = D, but for an EAGLE-3 head's [2D] first layer)."""
        q_TNH, k_TKH, v_TKH = self.qkv_proj(x)
        q_TNH, k_TKH = self.normalize_qk(q_TNH, k_TKH)
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
            soft_cap=self.soft_cap,
            k_scale=self.k_scale.get_value(),
            v_scale=self.v_scale.get_value(),
            sinks=None if self.sinks is None else self.sinks[...],
        )
        return self.o_proj(out_TNH), kv_cache

    def to_param_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        """A KV cache scale as a float32 scalar (checkpoints store it as [] or [1])."""
        if attr == "sinks":
            return super().to_param_layout(attr, tensors)
        (tensor,) = tensors
        if tensor.size != 1:
            raise ValueError(f"{attr} must be one value, got shape {tensor.shape}.")
        return np.asarray(tensor, np.float32).reshape(())

    def normalize_qk(
        self, q_TNH: Float[Array, "T N H"], k_TKH: Float[Array, "T K H"]
    ) -> tuple[Float[Array, "T N H"], Float[Array, "T K H"]]:
        """q and k as RoPE receives them (unchanged here; q/k-norm families override it)."""
        return q_TNH, k_TKH

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> KVCacheSpec:
        """What this layer keeps per token; `num_kv_heads` counts the heads the cache holds."""
        head = dict(num_kv_heads=num_kv_heads, head_size=self.head_dim, dtype=dtype)
        if self.sliding_window is None:
            return FullAttentionSpec(block_size, **head)
        return SlidingWindowSpec(block_size, **head, sliding_window=self.sliding_window)


class QKNormAttention(Attention):
    """Attention whose q and k heads are each RMS-normalized (over head_dim) before RoPE, as
    in Qwen 3 and Gemma 3; `NORM` is the family's norm."""

    NORM: ClassVar[type[nnx.Module]] = RMSNorm

    def __init__(self, args: AttentionArgs, rotary: RotaryEmbedding, *, dtype, backend, rngs):
        super().__init__(args, rotary, dtype=dtype, backend=backend, rngs=rngs)
        self.q_norm = self.NORM(args.head_dim, eps=args.rms_norm_eps, dtype=dtype)
        self.k_norm = self.NORM(args.head_dim, eps=args.rms_norm_eps, dtype=dtype)

    def normalize_qk(
        self, q_TNH: Float[Array, "T N H"], k_TKH: Float[Array, "T K H"]
    ) -> tuple[Float[Array, "T N H"], Float[Array, "T K H"]]:
        return self.q_norm(q_TNH), self.k_norm(k_TKH)
