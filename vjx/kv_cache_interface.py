"""What the block allocator must know of each kind of cache layer, and how layers group.

As vLLM's kv_cache_interface: every attention-like layer declares a `KVCacheSpec`; the worker
groups layers with equal specs into `KVCacheConfig.kv_cache_groups`; the scheduler's
`KVCacheManager` runs one single-type manager per group, and the step gets one block table
per group. The groups share one block size and one pool of block ids. Plain data: the device
layout of a block belongs to the attention backend, and dtypes are named by string (the core
knows no JAX).
"""

import abc
import dataclasses
import math
from collections.abc import Iterable

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}

KV_CACHE_DTYPES = {"auto": None, "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn"}
"""The `kv_cache_dtype` values vjx takes (vLLM's names) and the element type each stores;
"auto" (None) stores the model dtype."""


def kv_cache_dtype_name(kv_cache_dtype: str, model_dtype: str, platform: str = "gpu") -> str:
    """The element type of a cache of `kv_cache_dtype` on `platform` ("auto": `model_dtype`,
    except float32 for a 16-bit model on the CPU: XLA:CPU has no 16-bit gather or scatter,
    and would convert a layer's whole cache to float32 around each read and write, every
    step; SmolLM2-135M in bf16 on two cores, a 0.86 s decode step instead of 0.04 s)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}.")
    if KV_CACHE_DTYPES[kv_cache_dtype] is not None:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    return "float32" if platform == "cpu" and _DTYPE_BYTES[model_dtype] == 2 else model_dtype


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class KVCacheSpec(abc.ABC):
    """One layer's cache, as the block allocator sees it."""

    block_size: int
    """Tokens per block."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}.")

    @property
    @abc.abstractmethod
    def page_size_bytes(self) -> int:
        """Bytes one block of this layer holds (all of its heads)."""

    @abc.abstractmethod
    def max_num_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Most blocks one request ever holds at once in this layer's group."""


@dataclasses.dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    """A layer that keeps a key and a value of `head_size` per KV head and token."""

    num_kv_heads: int
    """KV heads the cache holds (with tensor parallelism, the repeated heads included)."""
    head_size: int
    dtype: str
    """Cache element type: "float32", "bfloat16", "float16", or "float8_e4m3fn" (one byte an
    element) for `kv_cache_dtype="fp8"`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_kv_heads < 1 or self.head_size < 1:
            raise ValueError(
                f"num_kv_heads and head_size must be at least 1, got {self.num_kv_heads} and {self.head_size}."
            )
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPE_BYTES)}, got {self.dtype!r}.")

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * _DTYPE_BYTES[self.dtype]


@dataclasses.dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Layers whose queries attend to every earlier token: a request keeps all its blocks."""

    def max_num_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return _cdiv(max_model_len, self.block_size)


@dataclasses.dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """Layers whose query at position p attends only to positions p - sliding_window + 1 .. p.

    Blocks that fall out of the window of a request's next token go back to the pool while
    the request runs."""

    sliding_window: int
    """Tokens each query sees, itself included."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {self.sliding_window}.")

    def max_num_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        # A step's chunk of new tokens plus the window of its first token; the window may
        # start mid-block, hence one block more.
        num_tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return _cdiv(num_tokens, self.block_size) + 1


@dataclasses.dataclass(frozen=True)
class MLAAttentionSpec(KVCacheSpec):
    """Multi-head latent attention (DeepSeek-V2/V3): one latent per token, shared by every head.

    A token's latent is its normed compressed KV (`kv_lora_rank` wide) followed by its rotary
    key part (`qk_rope_head_dim` wide): the keys of the absorbed form, whose first
    `kv_lora_rank` dims are also the values. Queries attend to every earlier token, so a
    request keeps all its blocks, as with full attention."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: str
    """Cache element type, as `AttentionSpec.dtype`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_lora_rank < 1 or self.qk_rope_head_dim < 0:
            raise ValueError(
                f"kv_lora_rank must be at least 1 and qk_rope_head_dim at least 0, got "
                f"{self.kv_lora_rank} and {self.qk_rope_head_dim}."
            )
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPE_BYTES)}, got {self.dtype!r}.")

    @property
    def latent_dim(self) -> int:
        """Elements of one token's cached latent: `kv_lora_rank + qk_rope_head_dim`."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.latent_dim * _DTYPE_BYTES[self.dtype]

    def max_num_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return _cdiv(max_model_len, self.block_size)


@dataclasses.dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A state-space (Mamba) layer: a fixed-size recurrent state per request instead of a cache
    that grows with its tokens.

    As in vLLM, a request's "block" in this group is its state slot: it holds one, taken at its
    first step and kept until it ends, whatever its length (`block_size` only matches the other
    groups'). The slots are a pool of their own, one per running request
    (`KVCacheConfig.num_state_slots`), not blocks of the block pool: a state row is far larger
    than an attention page (Bamba-9B's: 2 MB a layer against 64 kB for 16 tokens of an
    attention layer), so a block id that carried a state row in every state layer would make
    each token's attention block cost a whole state. (vLLM keeps one pool and pads the pages of
    both kinds to one size, sharing each page's memory between a layer of each group; vjx's
    layers each own their array, so it keeps the states apart instead.)

    A slot holds the layer's states back to back in one row of `dtype`: the causal
    convolution's last inputs, then the SSM state (`shapes`, in that order). A state covers
    every token so far, so no prefix of it can be shared: prefix caching finds no hit in this
    group (vLLM's default; its `align` mode, which keeps states at block boundaries, is not
    built)."""

    shapes: tuple[tuple[int, ...], ...]
    """The state arrays of one slot: ((conv_kernel - 1, conv_dim), (heads, head_dim, state_size))."""
    dtype: str
    """Element type of every state, as `AttentionSpec.dtype` (float8 is refused)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shapes or any(not shape or min(shape) < 1 for shape in self.shapes):
            raise ValueError(f"shapes must be non-empty shapes of positive sizes, got {self.shapes}.")
        if self.dtype not in _DTYPE_BYTES or self.dtype.startswith("float8"):
            allowed = sorted(d for d in _DTYPE_BYTES if not d.startswith("float8"))
            raise ValueError(f"dtype must be one of {allowed} for a Mamba state, got {self.dtype!r}.")

    @property
    def state_size(self) -> int:
        """Elements of one slot: every state of the layer, flattened."""
        return sum(math.prod(shape) for shape in self.shapes)

    @property
    def page_size_bytes(self) -> int:
        return self.state_size * _DTYPE_BYTES[self.dtype]

    def max_num_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return 0  # its slot comes from the state-slot pool


@dataclasses.dataclass(frozen=True)
class KVCacheGroupSpec:
    """One KV cache group: the layers that share a block table, and their spec."""

    layer_names: tuple[str, ...]
    """The model's layers in this group, in model order."""
    kv_cache_spec: KVCacheSpec


@dataclasses.dataclass(frozen=True)
class KVCacheConfig:
    """The engine's KV cache: how many block ids the pool has and how layers group.

    Every layer's cache array has `num_blocks` blocks; a block id is handed to one request
    in one group at a time (block 0 is the reserved null block)."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    num_state_slots: int = 0
    """Slots of every state-space layer (`MambaSpec`): one per running request and the
    scratch slot 0; 0 for a model without such layers."""

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved), got {self.num_blocks}.")
        if not self.kv_cache_groups:
            raise ValueError("kv_cache_groups must hold at least one group, got none.")
        if self.has_state_layers and self.num_state_slots < 2:
            raise ValueError(
                f"num_state_slots must be at least 2 (slot 0 is reserved) with state-space layers, got "
                f"{self.num_state_slots}."
            )

    @property
    def has_state_layers(self) -> bool:
        return any(isinstance(group.kv_cache_spec, MambaSpec) for group in self.kv_cache_groups)

    @property
    def block_size(self) -> int:
        return self.kv_cache_groups[0].kv_cache_spec.block_size

    def layer_group_ids(self, layer_names: Iterable[str]) -> tuple[int, ...]:
        """The group of each of `layer_names`, in their order."""
        group_of = {name: g for g, group in enumerate(self.kv_cache_groups) for name in group.layer_names}
        return tuple(group_of[name] for name in layer_names)

    def max_num_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks of the pool one request may hold at once, over every group."""
        return sum(
            group.kv_cache_spec.max_num_blocks_per_request(max_model_len, max_num_batched_tokens)
            for group in self.kv_cache_groups
        )


def get_kv_cache_groups(kv_cache_specs: dict[str, KVCacheSpec]) -> tuple[KVCacheGroupSpec, ...]:
    """Layers with equal specs share a group; groups in the order their first layer comes."""
    layers_by_spec: dict[KVCacheSpec, list[str]] = {}
    for layer_name, spec in kv_cache_specs.items():
        layers_by_spec.setdefault(spec, []).append(layer_name)
    return tuple(KVCacheGroupSpec(tuple(names), spec) for spec, names in layers_by_spec.items())
