"""Benchmark batches for paged attention, what they must read and compute, and a GPU timer.

Legend: T tokens, R rows, N query heads, K kv heads, H head dim, P pages, S page size.

A case is a list of rows `(num_cached, num_new)`, ordered decode-first like the model
runner's; every row's pages are drawn in random order from one pool.
"""

import dataclasses
import datetime
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vjx.attention.metadata import AttentionMetadata


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    rows: tuple[tuple[int, int], ...]
    num_heads: int = 32  # N
    num_kv_heads: int = 8  # K
    head_dim: int = 128  # H
    page_size: int = 16  # S
    num_padding_rows: int = 0

    @property
    def is_decode(self) -> bool:
        return all(num_new == 1 for _, num_new in self.rows)

    @property
    def num_tokens(self) -> int:
        """Real tokens rounded up to a multiple of 16 (the runner's buckets are too)."""
        real = sum(num_new for _, num_new in self.rows)
        return -(-real // 16) * 16

    def kv_bytes(self, dtype) -> int:
        """K and V bytes the step must read: every row's keys, once per kv head."""
        num_keys = sum(num_cached + num_new for num_cached, num_new in self.rows)
        return 2 * num_keys * self.num_kv_heads * self.head_dim * jnp.dtype(dtype).itemsize

    def flops(self) -> int:
        """2 matmuls x 2 flops x heads x head_dim per (query, visible key) pair (causal)."""
        pairs = sum(num_new * num_cached + num_new * (num_new + 1) // 2 for num_cached, num_new in self.rows)
        return 4 * self.num_heads * self.head_dim * pairs


CASES = (
    Case("decode 32 x 4k", ((4095, 1),) * 32),
    Case("decode 128 x 2k", ((2047, 1),) * 128),
    Case("decode 4 x 32k", ((32767, 1),) * 4),
    Case("prefill 4k", ((0, 4096),)),
    Case(
        "mixed 64 x 2k decode + 4 x 512 chunks on 1.5k",
        ((2047, 1),) * 64 + ((1536, 512),) * 4,
        num_padding_rows=4,
    ),
)


@dataclasses.dataclass(frozen=True)
class Batch:
    case: Case
    q: jax.Array  # [T, N, H]
    k: jax.Array  # [T, K, H]: this step's keys, already at their slots in the cache
    v: jax.Array
    kv_cache: jax.Array  # [2, K, P, S, H]
    md: AttentionMetadata


def _metadata(case: Case, rng: np.random.Generator) -> tuple[AttentionMetadata, int]:
    num_rows = len(case.rows) + case.num_padding_rows
    pages_per_row = [-(-(c + n) // case.page_size) for c, n in case.rows]
    width = max(pages_per_row)
    num_pages = sum(pages_per_row) + 1
    pool = rng.permutation(np.arange(1, num_pages, dtype=np.int32))
    block_tables = np.zeros((num_rows, width), np.int32)
    query_start_loc = np.zeros(num_rows + 1, np.int32)
    seq_lens = np.zeros(num_rows, np.int32)
    slot_mapping = np.arange(case.num_tokens, dtype=np.int32) % case.page_size
    first_page, start = 0, 0
    for row, ((num_cached, num_new), num_row_pages) in enumerate(zip(case.rows, pages_per_row)):
        pages = pool[first_page : first_page + num_row_pages]
        first_page += num_row_pages
        block_tables[row, :num_row_pages] = pages
        positions = np.arange(num_cached, num_cached + num_new)
        page_ids, offsets = pages[positions // case.page_size], positions % case.page_size
        slot_mapping[start : start + num_new] = page_ids * case.page_size + offsets
        seq_lens[row] = num_cached + num_new
        start += num_new
        query_start_loc[row + 1 :] = start
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(slot_mapping),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(block_tables),
        num_seqs=jnp.asarray([len(case.rows)], np.int32),
    )
    return md, num_pages


def make_batch(case: Case, dtype, seed: int = 0) -> Batch:
    """Random q and cache on the device; k/v are the cache rows at the step's slots."""
    md, num_pages = _metadata(case, np.random.default_rng(seed))
    key_q, key_cache = jax.random.split(jax.random.key(seed))
    cache_shape = (2, case.num_kv_heads, num_pages, case.page_size, case.head_dim)
    kv_cache = jax.random.normal(key_cache, cache_shape, dtype)
    q = jax.random.normal(key_q, (case.num_tokens, case.num_heads, case.head_dim), dtype)
    flat = kv_cache.reshape(2, case.num_kv_heads, -1, case.head_dim)
    k, v = jnp.swapaxes(flat[:, :, md.slot_mapping], 1, 2)
    return Batch(case, q, k, v, kv_cache, md)


def gpu_time_ms(fn, iterations: int = 20, *, is_chained: bool = False) -> tuple[float, str]:
    """Median time of `fn()` in ms and how it was taken: the sum of its kernels' times
    (CUPTI) when available, else the host clock around synchronized calls.

    CUPTI's `measure` jits `fn`, so a chained `fn` (one that carries a donated cache from call
    to call in Python state) is timed by the host clock over `iterations` calls in flight
    together instead: the mean, dispatch hidden behind the device work.
    """
    jax.block_until_ready(fn())
    if is_chained:
        start = time.perf_counter()
        for _ in range(iterations):
            out = fn()
        jax.block_until_ready(out)
        return (time.perf_counter() - start) * 1e3 / iterations, "wall, pipelined"
    try:
        from jax.experimental.mosaic.gpu import profiler

        _, times = profiler.measure(fn, iterations=iterations)()
        return statistics.median(times), "cupti"
    except Exception:  # CUPTI missing or busy: fall back to the host clock.
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), "wall"


def kernel_breakdown_ms(fn) -> list[tuple[str, float]]:
    """Each kernel of one call of `fn` with its time (CUPTI); empty when unavailable."""
    try:
        from jax.experimental.mosaic.gpu import profiler

        _, kernels = profiler.measure(fn, aggregate=False)()
        return [(name, float(ms)) for name, ms in kernels or []]
    except Exception:  # CUPTI missing or busy
        return []


def relative_error(out, expected) -> float:
    """||out - expected|| / ||expected|| in float64."""
    out, expected = np.asarray(out, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(out - expected) / np.linalg.norm(expected))


def results_header(script: str) -> dict:
    """The date, device, JAX version and command line every kernel benchmark records."""
    return {
        "date": datetime.date.today().isoformat(),
        "device": f"{jax.default_backend()}: {jax.devices()[0].device_kind}",
        "jax": jax.__version__,
        "command": " ".join([f"python -m {script}"] + sys.argv[1:]),
    }


def save_results(results: dict, out_dir: pathlib.Path, stem: str, markdown: str) -> None:
    """Writes `<stem>.json` and `<stem>.md` to `out_dir` (after every case, so a run cut off
    by its time limit keeps what it had)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / f"{stem}.md").write_text(markdown)
