"""The fp8 KV cache (vLLM's `kv_cache_dtype="fp8"`): what a write stores, how a read restores it.

An fp8 cache stores key k as float8_e4m3fn(clip(k / k_scale, -448, 448)) and value v likewise
with v_scale, where k_scale and v_scale are float32 scalars of the attention layer (vLLM's
per-tensor scales; None stands for 1.0, vLLM's value when the checkpoint has none). A reader
converts the loaded fp8 elements to the compute dtype (exactly: every e4m3 value is a
bfloat16) and applies the scales as it reads. A cache of any other dtype holds the model's
values as they are, and the scales do not apply to it (as in vLLM).
"""

import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Float

FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
FP8_MAX = float(jnp.finfo(FP8_DTYPE).max)  # 448: e4m3fn has no infinity, so a write saturates


def is_quantized(kv_dtype: DTypeLike) -> bool:
    """Whether a cache of `kv_dtype` holds scaled fp8 values rather than the model's."""
    return jnp.dtype(kv_dtype) == FP8_DTYPE


def compute_dtype(q_dtype: DTypeLike, kv_dtype: DTypeLike) -> jnp.dtype:
    """The dtype of attention's matmul operands: the query's over an fp8 cache, else the cache's."""
    return jnp.dtype(q_dtype if is_quantized(kv_dtype) else kv_dtype)


def kv_scales(k_scale: Float[Array, ""] | None, v_scale: Float[Array, ""] | None) -> Float[Array, "2"] | None:
    """[k_scale, v_scale] as one float32 array, the form a kernel takes them in (a None scale is
    1.0); None when both are None."""
    if k_scale is None and v_scale is None:
        return None
    return jnp.stack([jnp.asarray(1.0 if s is None else s, jnp.float32) for s in (k_scale, v_scale)])


def quantize(x: Array, scale: Float[Array, ""] | None, kv_dtype: DTypeLike) -> Array:
    """`x` as a cache of `kv_dtype` stores it: divided by `scale`, saturated and cast for fp8."""
    if not is_quantized(kv_dtype):
        return x.astype(kv_dtype)
    scaled = x.astype(jnp.float32) / (1.0 if scale is None else scale)
    return jnp.clip(scaled, -FP8_MAX, FP8_MAX).astype(kv_dtype)


def dequantize(x: Array, scale: Array | None, dtype: DTypeLike) -> Array:
    """Stored fp8 elements `x` as the `dtype` values they stand for (x * scale; None: 1.0)."""
    if scale is None:
        return x.astype(dtype)
    return (x.astype(jnp.float32) * scale).astype(dtype)
