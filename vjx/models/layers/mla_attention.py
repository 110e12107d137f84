"""Multi-head latent attention (MLA), DeepSeek-V2/V3's: one cached latent per token.

Legend: T tokens, D hidden, N heads, Q q_lora_rank, R kv_lora_rank, P qk_nope_head_dim,
E qk_rope_head_dim, V v_head_dim.

Keys and values come from one compressed vector per token, c_kv = norm(x W_DKV) [R], plus a
rotary key k_pe [E] shared by every head; the cache keeps [c_kv, k_pe] (R + E values a token
and layer) instead of per-head keys and values. W_UK and W_UV, which expand c_kv to each
head's key without rotary part [P] and its value [V], are the two halves of `kv_b_proj`'s
kernel [R, N, P + V]; vjx/attention/mla.py attends in the absorbed form (W_UK folded into
the query, W_UV into the output) for decode and in the expanded form for prefill, the same
product either way, with the cache R + E wide instead of N * (P + E + V).

DeepSeek lays the rotary dimensions out in interleaved pairs (`rope_interleave`; always in
V2): the loader reorders those output columns of the query and latent projections to
(evens, odds), after which the usual half-split rotation is the same rotation; q.k is
unchanged because query and key are reordered alike.

Quantized checkpoints (block-wise FP8, DeepSeek-V3's): the projections the layer calls stay
quantized (their methods own their matmuls), and every per-output-channel param they store
(block FP8's scales repeat each block's scale over its rows) is reordered with the kernel's
columns, so a rotary span may cross a block edge. `kv_b_proj` is read as W_UK and W_UV, not
called, so its kernel is dequantized to the model dtype at load (`DEQUANTIZE_AT_LOAD`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.mla import UpProjection, mla_attention
from vjx.kv_cache_interface import KVCacheSpec, MLAAttentionSpec
from vjx.models.layers.linear import Linear
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.rotary import RotaryEmbedding


@dataclasses.dataclass(frozen=True)
class MLAArgs:
    """One MLA layer's shape, as DeepSeek's config gives it."""

    hidden_size: int
    num_heads: int
    q_lora_rank: int | None
    """None (V2-Lite): the query is one projection of x."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    sm_scale: float
    rope_interleave: bool
    attention_bias: bool
    rms_norm_eps: float

    @classmethod
    def from_hf_config(cls, hf_config: Any, *, rope_interleave: bool) -> "MLAArgs":
        qk_head_dim = hf_config.qk_nope_head_dim + hf_config.qk_rope_head_dim
        return cls(
            hidden_size=hf_config.hidden_size,
            num_heads=hf_config.num_attention_heads,
            q_lora_rank=hf_config.q_lora_rank,
            kv_lora_rank=hf_config.kv_lora_rank,
            qk_nope_head_dim=hf_config.qk_nope_head_dim,
            qk_rope_head_dim=hf_config.qk_rope_head_dim,
            v_head_dim=hf_config.v_head_dim,
            sm_scale=_yarn_softmax_scale(hf_config, qk_head_dim**-0.5),
            rope_interleave=rope_interleave,
            attention_bias=getattr(hf_config, "attention_bias", False),
            rms_norm_eps=hf_config.rms_norm_eps,
        )


def _yarn_softmax_scale(hf_config: Any, scale: float) -> float:
    """DeepSeek's YaRN also scales q.k by mscale(factor, mscale_all_dim)^2."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    mscale_all_dim = params.get("mscale_all_dim")
    if params.get("rope_type", "default") == "default" or not mscale_all_dim:
        return scale
    factor = params["factor"]
    mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * np.log(factor) + 1.0
    return scale * mscale * mscale


class RopeColumnsLinear(Linear):
    """A projection whose trailing `rope_dim` output columns (of each head, for a kernel
    with a head axis) hold interleaved rotary pairs: the loader reorders them to (evens,
    odds) when `interleaved`."""

    def __init__(self, *args, rope_dim: int, interleaved: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.rope_dim = rope_dim
        self.interleaved = interleaved

    def to_param_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        """The param's layout, rotary columns reordered in every param whose trailing
        dimensions are the outputs (the kernel, the bias, per-channel scales)."""
        param = super().to_param_layout(attr, tensors)
        if not self.interleaved or param.shape[param.ndim - len(self.out_shape) :] != self.out_shape:
            return param
        width = param.shape[-1]
        rope = np.arange(width - self.rope_dim, width)
        order = np.concatenate([np.arange(width - self.rope_dim), rope[0::2], rope[1::2]])
        return param[..., order]


class LatentUpProjection(Linear):
    """`kv_b_proj`, whose kernel [R, N, P + V] MLA reads as W_UK and W_UV instead of calling
    the layer: a quantization method leaves it in the model dtype (vjx/quantization/fp8.py)."""

    DEQUANTIZE_AT_LOAD = True


class MLAAttention(nnx.Module):
    """DeepSeek's attention over a latent cache (see the module docstring)."""

    def __init__(self, args: MLAArgs, rotary: RotaryEmbedding, *, dtype, rngs):
        D, N, R, P, E, V = (
            args.hidden_size,
            args.num_heads,
            args.kv_lora_rank,
            args.qk_nope_head_dim,
            args.qk_rope_head_dim,
            args.v_head_dim,
        )
        rope = dict(rope_dim=E, interleaved=args.rope_interleave, dtype=dtype, rngs=rngs)
        if args.q_lora_rank is None:
            self.q_proj = RopeColumnsLinear(
                "TD,DNH->TNH", (D, N, P + E), ("embed", "heads", None), use_bias=False, **rope
            )
        else:
            Q = args.q_lora_rank
            self.q_a_proj = Linear(
                "TD,DQ->TQ", (D, Q), ("embed", None), use_bias=args.attention_bias, dtype=dtype, rngs=rngs
            )
            self.q_a_layernorm = RMSNorm(Q, eps=args.rms_norm_eps, dtype=dtype)
            self.q_b_proj = RopeColumnsLinear(
                "TQ,QNH->TNH", (Q, N, P + E), (None, "heads", None), use_bias=False, **rope
            )
        self.kv_a_proj_with_mqa = RopeColumnsLinear(
            "TD,DL->TL", (D, R + E), ("embed", None), use_bias=args.attention_bias, **rope
        )
        self.kv_a_layernorm = RMSNorm(R, eps=args.rms_norm_eps, dtype=dtype)
        self.kv_b_proj = LatentUpProjection(
            "TR,RNH->TNH", (R, N, P + V), (None, "heads", None), use_bias=False, dtype=dtype, rngs=rngs
        )
        self.o_proj = Linear(
            "TNV,NVD->TD", (N, V, D), ("heads", None, "embed"), use_bias=args.attention_bias, dtype=dtype, rngs=rngs
        )
        self.rotary = rotary
        self.args = args

    def __call__(
        self, x: Float[Array, "T D"], positions: Int[Array, " T"], kv_cache: Array, md: AttentionMetadata
    ) -> tuple[Float[Array, "T D"], Array]:
        args = self.args
        P, R = args.qk_nope_head_dim, args.kv_lora_rank
        if args.q_lora_rank is None:
            q_TNH = self.q_proj(x)
        else:
            q_TNH = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        kv_TL = self.kv_a_proj_with_mqa(x)
        c_kv_TR = self.kv_a_layernorm(kv_TL[:, :R])
        k_pe_T1E = self.rotary(kv_TL[:, None, R:], positions)
        q_TNH = jnp.concatenate([q_TNH[..., :P], self.rotary(q_TNH[..., P:], positions)], axis=-1)
        latent_TL = jnp.concatenate([c_kv_TR, k_pe_T1E[:, 0]], axis=-1)
        kernel = self.kv_b_proj.kernel
        up = UpProjection(w_uk=kernel[:, :, :P], w_uv=kernel[:, :, P:])
        out_TNV, kv_cache = mla_attention(q_TNH, latent_TL, kv_cache, md, up, sm_scale=args.sm_scale)
        return self.o_proj(out_TNV), kv_cache

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> KVCacheSpec:
        """One latent a token, whatever the heads (`num_kv_heads` is not read)."""
        if dtype.startswith("float8"):
            raise ValueError("kv_cache_dtype='fp8' with an MLA model (DeepSeek) is not built yet; use 'auto'.")
        return MLAAttentionSpec(block_size, self.args.kv_lora_rank, self.args.qk_rope_head_dim, dtype)
