"""KV cache blocks, the LRU queue of free blocks, and the chained hashes of full blocks.

A full block's hash is `sha256(parent hash || number of tokens || token ids as little-endian
int64 || repr(extra keys))`, the first block's parent being the fixed `NONE_HASH`. So one hash
names a whole prefix, not just a block's own tokens. sha256 rather than Python's `hash` on
tuples: a collision would silently hand one prompt another prompt's K/V, and 64-bit tuple
hashes of integers can be collided on purpose by whoever writes the prompts; the cost (about
a microsecond per block, once per block) is small beside a model step.
"""

import dataclasses
import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

BlockHash = NewType("BlockHash", bytes)
"""A 32-byte sha256 digest naming a full block and every block before it."""

NONE_HASH = BlockHash(hashlib.sha256(b"vjx: parent of a request's first block").digest())


def hash_block_tokens(
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[int | str, ...] | None = None,
) -> BlockHash:
    """The hash of one full block, chained to its parent's (None for a first block).

    `extra_keys` tell apart blocks of equal tokens whose K/V differ (a LoRA adapter, a salt).
    """
    hasher = hashlib.sha256(NONE_HASH if parent_block_hash is None else parent_block_hash)
    num_tokens = len(curr_block_token_ids)
    hasher.update(struct.pack(f"<I{num_tokens}q", num_tokens, *curr_block_token_ids))
    if extra_keys:
        hasher.update(repr(extra_keys).encode())
    return BlockHash(hasher.digest())


def hash_request_tokens(
    block_size: int,
    token_ids: Sequence[int],
    known_block_hashes: Sequence[BlockHash] = (),
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids` past the `known_block_hashes` of its first ones.

    Passing the hashes already known lets a growing request hash only its newly full blocks;
    a trailing partial block gets no hash.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}.")
    parent = known_block_hashes[-1] if known_block_hashes else None
    new_hashes = []
    first_token = len(known_block_hashes) * block_size
    for start in range(first_token, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        new_hashes.append(parent)
    return new_hashes


@dataclasses.dataclass(slots=True, eq=False, repr=False)
class KVCacheBlock:
    """One block of the paged KV cache: its id, its users and its place in the free queue."""

    block_id: int
    ref_cnt: int = 0
    """Requests holding this block; 0 means it sits in the free queue (unless it is null)."""
    block_hash: BlockHash | None = None
    """Set while the block is full and in the prefix cache; cleared when it is reused."""
    prev_free_block: "KVCacheBlock | None" = None
    next_free_block: "KVCacheBlock | None" = None
    is_null: bool = False
    """The scratch block 0: padding tokens write there and no request ever holds it."""

    def __repr__(self) -> str:
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        cached = self.block_hash.hex()[:8] if self.block_hash else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"block_hash={cached}, prev={prev_id}, next={next_id})"
        )


class FreeKVCacheBlockQueue:
    """The free blocks as a doubly linked list threaded through the blocks themselves.

    The head is evicted first, so freed blocks go to the tail: least recently used first.
    A cached block that a new request hits is taken out of the middle, hence the links
    rather than a deque. Every operation is O(1) and allocates nothing: the links live in the
    blocks and two sentinels spare the empty-list branches.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        previous = self._head
        for block in blocks:
            previous.next_free_block = block
            block.prev_free_block = previous
            previous = block
        previous.next_free_block = self._tail
        self._tail.prev_free_block = previous

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("popleft: the free block queue is empty.")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"popleft_n: n={n} exceeds the {self.num_free_blocks} free blocks.")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None or next_block is None:
            raise ValueError(f"remove: block {block.block_id} is not in the free queue.")
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (next evicted) to tail; O(n), for tests and debugging."""
        blocks = []
        block = self._head.next_free_block
        while block is not self._tail:
            blocks.append(block)
            block = block.next_free_block
        return blocks


@dataclasses.dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the last reset, counted in tokens as vLLM's metrics are."""

    num_requests: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_resets: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0
