"""Rotary position embedding in Hugging Face's convention (rotate_half, HF q/k weight layout).

The two halves of each head (not interleaved pairs as in llama.cpp) form the rotated
planes: x * cos + rotate_half(x) * sin with cos/sin = [freqs, freqs]. With a
`partial_rotary_factor` below one (Bamba), only the first `head_dim * factor` dimensions of a
head rotate (their halves form the planes) and the rest pass through, as in HF. Inverse frequencies
are computed once on the host in float32, as HF does, so scaled variants (llama3, linear,
YaRN) match HF bit for bit before the rotation wherever torch rounds theta ** (2i / H)
correctly (its vectorized pow is one ulp off in two planes at gpt-oss's theta 150000).
"""

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

DEFAULT_ROPE_THETA = 10000.0
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


@dataclasses.dataclass(frozen=True)
class RotaryEmbedding:
    """Rotates q or k by absolute token position; hashable, so a module holds it statically."""

    inv_freq: tuple[float, ...]
    """One inverse frequency per rotated plane (head_dim / 2 of them), float32 values."""
    attention_scaling: float = 1.0
    """Factor on cos and sin (LongRoPE's and YaRN's attention factor); 1 for the other types."""

    @classmethod
    def from_hf_config(
        cls, hf_config: Any, head_dim: int, *, layer_type: str | None = None, max_model_len: int | None = None
    ) -> "RotaryEmbedding":
        """The rotation of `hf_config` (of its `layer_type` layers when the config gives RoPE
        parameters per layer type). `max_model_len` picks LongRoPE's long factors when it
        exceeds the original context, for every position, as vLLM does: a request's cached
        keys then never need re-rotating (HF instead switches on the current length)."""
        params = rope_parameters(hf_config, layer_type)
        rope_type = params["rope_type"]
        head_dim = _rotary_dim(head_dim, params.get("partial_rotary_factor", 1.0))
        powers = _rope_powers(float(params["rope_theta"]), head_dim)
        inv_freq = np.float32(1.0) / powers
        attention_scaling = 1.0
        if rope_type == "linear":
            inv_freq = inv_freq / np.float32(params["factor"])
        elif rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, params, hf_config.max_position_embeddings)
        elif rope_type == "longrope":
            max_len = hf_config.max_position_embeddings if max_model_len is None else max_model_len
            inv_freq, attention_scaling = _longrope(powers, params, hf_config, max_len)
        elif rope_type == "yarn":
            inv_freq, attention_scaling = _yarn(powers, params, hf_config, head_dim)
        elif rope_type != "default":
            raise ValueError(f"rope_type must be one of {SUPPORTED_ROPE_TYPES}, got {rope_type!r}.")
        return cls(inv_freq=tuple(float(f) for f in inv_freq.astype(np.float32)), attention_scaling=attention_scaling)

    def __call__(self, x: Float[Array, "T N H"], positions: Int[Array, " T"]) -> Float[Array, "T N H"]:
        inv_freq = jnp.asarray(np.asarray(self.inv_freq, np.float32))
        freqs_TF = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
        angles_TH = jnp.concatenate([freqs_TF, freqs_TF], axis=-1)
        cos, sin = jnp.cos(angles_TH), jnp.sin(angles_TH)
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        cos = cos.astype(x.dtype)[:, None, :]
        sin = sin.astype(x.dtype)[:, None, :]
        rotary_dim = 2 * len(self.inv_freq)
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        x1, x2 = jnp.split(x_rot, 2, axis=-1)
        rotated = x_rot * cos + jnp.concatenate([-x2, x1], axis=-1) * sin
        return rotated if rotary_dim == x.shape[-1] else jnp.concatenate([rotated, x_pass], axis=-1)


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """`rope_type`, `rope_theta` and scaling fields, from transformers 4.x or 5.x configs.

    transformers 5 keeps everything in `rope_parameters`, nested by layer type for models whose
    layer types rotate differently (Gemma 3: local and global layers); 4.x has `rope_theta`
    and an optional `rope_scaling` dict whose type key is `rope_type` or, in older files, `type`.
    """
    params: dict[str, Any] = {"rope_theta": getattr(hf_config, "rope_theta", DEFAULT_ROPE_THETA)}
    for attr in ("rope_scaling", "rope_parameters"):
        extra = getattr(hf_config, attr, None)
        if extra and layer_type in extra:
            extra = extra[layer_type]
        if extra:
            params.update(extra)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if "partial_rotary_factor" not in params and getattr(hf_config, "partial_rotary_factor", None) is not None:
        params["partial_rotary_factor"] = hf_config.partial_rotary_factor
    return params


def _rotary_dim(head_dim: int, partial_rotary_factor: float) -> int:
    """The dimensions of a head that rotate: `head_dim * partial_rotary_factor`, as HF rounds it."""
    rotary_dim = int(head_dim * partial_rotary_factor)
    if not 0 < partial_rotary_factor <= 1 or rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor must be in (0, 1] and give an even number of rotated dims of the "
            f"{head_dim}, got {partial_rotary_factor} ({rotary_dim} dims)."
        )
    return rotary_dim


def _rope_powers(theta: float, head_dim: int) -> np.ndarray:
    """theta ** (2i / head_dim) per plane i: the wavelengths / 2 pi of plain RoPE."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    # The power is rounded once to float32 (computed in float64), as torch's scalar float pow is.
    return (np.float64(theta) ** exponents.astype(np.float64)).astype(np.float32)


def _llama3_inv_freq(inv_freq: np.ndarray, params: dict[str, Any], max_position_embeddings: int) -> np.ndarray:
    """Llama 3.1's scaling: long wavelengths slowed by `factor`, short ones kept, a smooth
    blend in between."""
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params.get("original_max_position_embeddings") or max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    # scalar / array is reciprocal-then-multiply, the rounding torch's `__rtruediv__` has.
    wavelen = np.reciprocal(inv_freq) * np.float32(2 * math.pi)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (np.reciprocal(wavelen) * np.float32(old_context_len) - np.float32(low_freq_factor)) / np.float32(
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def _longrope(powers: np.ndarray, params: dict[str, Any], hf_config: Any, max_len: int) -> tuple[np.ndarray, float]:
    """Phi-3's LongRoPE: per-plane factors (long ones beyond the original context) and a
    factor on cos/sin that grows with the context extension."""
    original = params.get("original_max_position_embeddings") or hf_config.original_max_position_embeddings
    factors = params["long_factor"] if max_len > original else params["short_factor"]
    scaled = np.float32(1.0) / (np.asarray(factors, np.float32) * powers)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        factor = params.get("factor") or hf_config.max_position_embeddings / original
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return scaled, float(attention_factor)


def _yarn(powers: np.ndarray, params: dict[str, Any], hf_config: Any, head_dim: int) -> tuple[np.ndarray, float]:
    """YaRN: planes that turn fewer than `beta_slow` times over the original context are
    slowed by `factor`, those turning more than `beta_fast` times are kept, a linear ramp
    blends the ones between; cos and sin grow with log(factor)."""
    original = (
        params.get("original_max_position_embeddings")
        or getattr(hf_config, "original_max_position_embeddings", None)
        or hf_config.max_position_embeddings
    )
    factor = float(params.get("factor") or hf_config.max_position_embeddings / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    extrapolation = np.reciprocal(powers)
    interpolation = np.reciprocal(np.float32(factor) * powers)
    kept = np.float32(1.0) - _yarn_ramp(params, float(params["rope_theta"]), head_dim, original)
    inv_freq = interpolation * (np.float32(1.0) - kept) + extrapolation * kept
    return inv_freq, float(attention_factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """The paper's cos/sin factor, 0.1 * mscale * ln(factor) + 1 (1 when not extending)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_ramp(params: dict[str, Any], theta: float, head_dim: int, original: int) -> np.ndarray:
    """Per plane, 0 up to the last plane turning `beta_fast` times over the original context,
    1 from the first turning only `beta_slow` times, linear between; the bounds are rounded
    outward to whole planes unless `truncate` is False (gpt-oss)."""

    def plane(num_rotations: float) -> float:
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = plane(float(params.get("beta_fast") or 32)), plane(float(params.get("beta_slow") or 1))
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a step instead of a ramp, without dividing by zero
    ramp = (np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
    return np.clip(ramp, 0, 1)
