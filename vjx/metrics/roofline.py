"""The roofline model of a step: the bytes it must move and the FLOPs it must do (a dense
Llama-family decoder; benchmarks/roofline.py documents the counts), and the published peaks of
known devices. The engine's live utilization (vjx/metrics/utilization.py) and the benchmarks'
roofline columns both use it.
"""

import dataclasses
import json


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    hbm_bytes_per_s: float | None
    dense_bf16_flops_per_s: float | None


# Published peaks by JAX `device_kind` (torch's device name is the same string on NVIDIA).
DEVICE_PEAKS = {
    "NVIDIA H200": DevicePeak(hbm_bytes_per_s=4.8e12, dense_bf16_flops_per_s=989e12),
    "NVIDIA H100 80GB HBM3": DevicePeak(hbm_bytes_per_s=3.35e12, dense_bf16_flops_per_s=989e12),
}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}.")
    return DTYPE_BYTES[dtype]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    num_layers: int  # L
    hidden_size: int  # D
    num_heads: int  # N
    num_kv_heads: int  # K
    head_dim: int  # H
    intermediate_size: int  # F
    vocab_size: int  # V
    tie_word_embeddings: bool
    dtype_bytes: int  # b

    @classmethod
    def from_hf_config(cls, config: dict, dtype: str) -> "ModelShape":
        """From a config.json dict (or a transformers config's `to_dict()`)."""
        num_heads = config["num_attention_heads"]
        return cls(
            num_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes(dtype),
        )

    @classmethod
    def from_model_dir(cls, model_dir: str, dtype: str) -> "ModelShape":
        with open(f"{model_dir}/config.json") as f:
            return cls.from_hf_config(json.load(f), dtype)

    @property
    def layer_linear_params(self) -> int:
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        layer = self.layer_linear_params + 2 * self.hidden_size
        tables = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return tables + self.num_layers * layer + self.hidden_size

    @property
    def weight_bytes_per_step(self) -> int:
        """Weights a step reads whole: all but an untied embedding table."""
        params = self.num_params - (0 if self.tie_word_embeddings else self.embedding_params)
        return params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes


def step_bytes(shape: ModelShape, requests: list[tuple[int, int | float]]) -> int | float:
    """Bytes one step moves; `requests` holds (new tokens q, keys after the step s) each."""
    num_tokens = sum(q for q, _ in requests)
    kv_tokens = sum(s for _, s in requests) + num_tokens
    embed_rows = num_tokens * shape.hidden_size * shape.dtype_bytes
    return shape.weight_bytes_per_step + embed_rows + kv_tokens * shape.kv_bytes_per_token


def step_flops(shape: ModelShape, requests: list[tuple[int, int | float]]) -> int | float:
    """FLOPs of one step; `requests` holds (new tokens q, keys after the step s) each."""
    num_tokens = sum(q for q, _ in requests)
    # Query i (0-based) of q sees s - q + i + 1 keys: q*s - q*(q-1)/2 pairs in all.
    pairs = sum(q * s - q * (q - 1) // 2 for q, s in requests)
    linear = 2 * num_tokens * shape.num_layers * shape.layer_linear_params
    lm_head = 2 * len(requests) * shape.hidden_size * shape.vocab_size
    attention = 4 * shape.num_heads * shape.head_dim * shape.num_layers * pairs
    return linear + lm_head + attention
