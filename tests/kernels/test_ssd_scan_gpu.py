"""The Triton-compiled SSD scan kernel on the GPU at Mamba2-2.7B widths (run with `pytest -m gpu`).

80 heads of 64, one group, state 128, chunks of 256: a ragged step (two decodes, a 1000-token
prefill continuing a state, a fresh 2000-token prompt, padding), a decode-only step of 64 rows
and one 4k-token prompt, each against the jnp chunked scan (vjx/mamba/ssd.py) on the same
inputs, and timed (printed; run with `-s` to see the times).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.kernels.attention_cases import gpu_time_ms
from tests.helpers.attention_batches import relative_error
from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.ssd_scan import mamba_chunk_scan_combined as kernel_scan
from vjx.mamba.ssd import SsdInputs
from vjx.mamba.ssd import mamba_chunk_scan_combined as reference_scan

pytestmark = pytest.mark.gpu

HEADS, HEAD_DIM, GROUPS, STATE, CHUNK = 80, 64, 1, 128, 256
DT_LIMIT = (0.0, float("inf"))


def make_step(requests: list[tuple[int, int]], num_tokens: int, num_rows: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    query_start_loc = np.zeros(num_rows + 1, np.int32)
    seq_lens = np.zeros(num_rows, np.int32)
    for row, (num_cached, num_new) in enumerate(requests):
        seq_lens[row] = num_cached + num_new
        query_start_loc[row + 1] = query_start_loc[row] + num_new
    query_start_loc[len(requests) + 1 :] = query_start_loc[len(requests)]
    md = AttentionMetadata(
        slot_mapping=jnp.zeros(num_tokens, jnp.int32),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(np.arange(num_rows, dtype=np.int32)[:, None] + 1),
        num_seqs=jnp.asarray([len(requests)], np.int32),
    )
    inputs = (
        rng.standard_normal((num_tokens, HEADS, HEAD_DIM)),
        rng.standard_normal((num_tokens, HEADS)) - 4.0,
        -rng.uniform(1, 16, HEADS),
        rng.standard_normal((num_tokens, GROUPS, STATE)) * 0.3,
        rng.standard_normal((num_tokens, GROUPS, STATE)) * 0.3,
        rng.standard_normal(HEADS),
        rng.uniform(-1, 1, HEADS),
    )
    inputs = tuple(jnp.asarray(x, dtype if i in (0, 3, 4) else jnp.float32) for i, x in enumerate(inputs))
    states = jnp.asarray(rng.standard_normal((num_rows, HEADS, HEAD_DIM, STATE)) * 0.1, jnp.float32)
    return inputs, states, md


@functools.partial(jax.jit, static_argnames="use_kernel")
def scan(inputs, states, md, use_kernel: bool):
    inputs = SsdInputs(*inputs)
    if use_kernel:
        return kernel_scan(inputs, states, md, chunk_size=CHUNK, dt_limit=DT_LIMIT)
    return reference_scan(inputs, states, md, chunk_size=CHUNK, dt_limit=DT_LIMIT)


def check_and_time(label: str, requests, num_tokens: int, num_rows: int, dtype) -> None:
    inputs, states, md = make_step(requests, num_tokens, num_rows, dtype)
    y, final = scan(inputs, states, md, True)
    y_ref, final_ref = scan(inputs, states, md, False)
    real = sum(n for _, n in requests)
    # float32 dots run in TF32 on the GPU, in the kernel and in XLA's scan alike (1.2e-4 apart on an H100).
    tolerance = 2e-3 if dtype == jnp.float32 else 3e-2
    assert relative_error(np.asarray(y[:real], np.float32), np.asarray(y_ref[:real], np.float32)) < tolerance
    assert relative_error(np.asarray(final[: len(requests)]), np.asarray(final_ref[: len(requests)])) < tolerance
    ours, how = gpu_time_ms(lambda: scan(inputs, states, md, True))
    ref, _ = gpu_time_ms(lambda: scan(inputs, states, md, False), iterations=5)
    print(f"\n{label} ({jax.devices()[0].device_kind}, {how}): kernel {ours * 1e3:.0f} us, jnp scan {ref * 1e3:.0f} us")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_ragged_step(dtype):
    check_and_time("ragged 3003 tokens", [(500, 1), (40, 1), (3000, 1000), (0, 2000)], 4096, 8, dtype)


def test_decode_batch_64():
    check_and_time("decode B=64", [(1000, 1)] * 64, 64, 64, jnp.bfloat16)


def test_prefill_4k():
    check_and_time("prefill 4096", [(0, 4096)], 4096, 1, jnp.bfloat16)
