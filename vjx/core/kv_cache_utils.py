"""KV cache blocks, the LRU queue of free blocks, and the chained hashes of full blocks.

A full block's hash is `hash_fn(header || parent hash || token ids || extra keys)`: the header
packs the parent hash's length and the number of tokens (so the encoding is prefix-free), the
token ids are little-endian int64 and the extra keys (a LoRA name, a cache salt) are their
`repr`. The first block's parent is the fixed `NONE_HASH`, so one hash names a whole prefix,
not just a block's own tokens. A cryptographic hash rather than Python's `hash` on tuples: a
collision would silently hand one prompt another prompt's K/V, and 64-bit tuple hashes of
integers can be collided on purpose by whoever writes the prompts. `sha256` is the default;
`blake2b` (128-bit digest) is the alternative. Each costs under a microsecond per block,
once per block (benchmarks/kv_cache_manager.py measures both).
"""

import dataclasses
import hashlib
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import NewType

BlockHash = NewType("BlockHash", bytes)
"""A digest naming a full block and every block before it."""

BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
"""A block hash followed by a KV cache group id (4 bytes, big-endian): the prefix cache's key,
since groups of different attention types keep different K/V for the same tokens."""

HashFunction = Callable[[bytes], BlockHash]

NONE_HASH = BlockHash(hashlib.sha256(b"vjx: parent of a request's first block").digest())

_TOKEN_BYTES = 8
_HEADER = struct.Struct("<BI")


def sha256(data: bytes) -> BlockHash:
    return BlockHash(hashlib.sha256(data).digest())


def blake2b(data: bytes) -> BlockHash:
    return BlockHash(hashlib.blake2b(data, digest_size=16).digest())


_HASH_FUNCTIONS: dict[str, HashFunction] = {"sha256": sha256, "blake2b": blake2b}


def get_hash_fn_by_name(hash_algo: str) -> HashFunction:
    """The block hash function named by `hash_algo`: "sha256" or "blake2b"."""
    if hash_algo not in _HASH_FUNCTIONS:
        raise ValueError(f"hash_algo must be one of {sorted(_HASH_FUNCTIONS)}, got {hash_algo!r}.")
    return _HASH_FUNCTIONS[hash_algo]


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big"))


def _hash_block_bytes(hash_fn: HashFunction, parent: BlockHash, token_bytes: bytes, extra: bytes) -> BlockHash:
    header = _HEADER.pack(len(parent), len(token_bytes) // _TOKEN_BYTES)
    return hash_fn(header + parent + token_bytes + extra)


def hash_block_tokens(
    hash_fn: HashFunction,
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[int | str, ...] | None = None,
) -> BlockHash:
    """The hash of one full block, chained to its parent's (None for a first block).

    `extra_keys` tell apart blocks of equal tokens whose K/V differ (a LoRA adapter, a salt).
    """
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    token_bytes = array("q", curr_block_token_ids).tobytes()
    extra = repr(extra_keys).encode() if extra_keys else b""
    return _hash_block_bytes(hash_fn, parent, token_bytes, extra)


def hash_request_tokens(
    hash_fn: HashFunction,
    block_size: int,
    token_ids: Sequence[int],
    known_block_hashes: Sequence[BlockHash] = (),
    cache_salt: str | None = None,
    lora_key: tuple[str, int] | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids` past the `known_block_hashes` of its first ones.

    Equal to chaining `hash_block_tokens` block by block; `cache_salt` and the LoRA adapter's
    (name, id) (vLLM's extra keys; with the id, an adapter unloaded and loaded again under its
    name gets new blocks) are the first block's only extra keys, and through the chain they
    change every later hash too: requests of different salts or adapters never share a block.
    Passing the hashes already known lets a growing request hash only its newly full blocks; a
    trailing partial block gets no hash.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}.")
    num_known = len(known_block_hashes)
    num_full_blocks = len(token_ids) // block_size
    if num_full_blocks <= num_known:
        return []
    # One conversion for all new blocks: the per-block work is then a slice and a hash.
    new_token_ids = token_ids[num_known * block_size : num_full_blocks * block_size]
    token_bytes = array("q", new_token_ids).tobytes()
    stride = block_size * _TOKEN_BYTES
    new_hashes = []
    start = 0
    parent = known_block_hashes[-1] if num_known else NONE_HASH
    if not num_known:
        extra_keys = ((cache_salt,) if cache_salt else ()) + ((("lora", *lora_key),) if lora_key else ())
        extra = repr(extra_keys).encode() if extra_keys else b""
        parent = _hash_block_bytes(hash_fn, parent, token_bytes[:stride], extra)
        new_hashes.append(parent)
        start = stride
    # Past the first block every parent is a digest of one length: one header for all.
    header = _HEADER.pack(len(parent), block_size)
    for offset in range(start, len(token_bytes), stride):
        parent = hash_fn(header + parent + token_bytes[offset : offset + stride])
        new_hashes.append(parent)
    return new_hashes


@dataclasses.dataclass(slots=True, eq=False, repr=False)
class KVCacheBlock:
    """One block of the paged KV cache: its id, its users and its place in the free queue."""

    block_id: int
    ref_cnt: int = 0
    """Requests holding this block; 0 means it sits in the free queue (unless it is null)."""
    block_hash: BlockHashWithGroupId | None = None
    """Set while the block is full and in the prefix cache; cleared when it is reused."""
    prev_free_block: "KVCacheBlock | None" = None
    next_free_block: "KVCacheBlock | None" = None
    is_null: bool = False
    """The scratch block 0: padding tokens and skipped (out-of-window) positions point at it;
    it is never free, never handed out and never ref-counted."""

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
    rather than a deque. Every operation is O(1) per block and allocates no list nodes: the
    links live in the blocks and two sentinels spare the empty-list branches.
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
        """The first `n` blocks, unlinked in one walk: the list is re-joined once at the end."""
        if n > self.num_free_blocks:
            raise ValueError(f"popleft_n: n={n} exceeds the {self.num_free_blocks} free blocks.")
        blocks = []
        block = self._head.next_free_block
        for _ in range(n):
            blocks.append(block)
            next_block = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = next_block
        self._head.next_free_block = block
        block.prev_free_block = self._head
        self.num_free_blocks -= n
        return blocks

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

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Append `blocks` in order, linking them in one walk."""
        last = self._tail.prev_free_block
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self._tail
        self._tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

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
    """Prefix-cache lookups since start, counted in tokens as vLLM's metrics are."""

    num_requests: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_resets: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0
