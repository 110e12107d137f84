"""What the block allocator must know of each kind of attention layer, and how layers group.

Layers of one attention type share a KV cache group: one block table, one list of block ids
per request. A model with sliding-window and full-attention layers (Gemma 3) has a group of
each; the groups share one block size and one pool of block ids. Plain data: the device
layout of a block belongs to the attention backend.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class FullAttentionSpec:
    """Layers whose queries attend to every earlier token."""

    block_size: int
    """Tokens per block."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}.")


@dataclasses.dataclass(frozen=True)
class SlidingWindowSpec:
    """Layers whose query at position p attends only to positions p - sliding_window + 1 .. p."""

    block_size: int
    """Tokens per block."""
    sliding_window: int
    """Tokens each query sees, itself included."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}.")
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {self.sliding_window}.")


KVCacheSpec = FullAttentionSpec | SlidingWindowSpec


@dataclasses.dataclass(frozen=True)
class KVCacheGroupSpec:
    """One KV cache group: the layers that share a block table, and their attention type."""

    layer_names: tuple[str, ...]
    """The model's layers in this group, for the runner to map layers to block tables."""
    kv_cache_spec: KVCacheSpec
