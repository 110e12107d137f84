"""CpuBackend against the float64 dense oracle and the reference, on ragged paged batches
that take each of its two paths: decode steps (one gather a chunk for all tokens) and any
other step (blocks of queries walking their rows), with several chunks a row, blocks that
span one row or many, sliding windows that skip whole chunks, soft caps and padding.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from tests.helpers.quick_compile import quick_jit
from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, assert_greedy_like_transformers, save_tiny_llama
from vjx import LLM, SamplingParams
from vjx.attention.backend import default_backend_name, get_attention_backend
from vjx.attention.cpu import CpuBackend
from vjx.attention.reference import ReferenceBackend

SHAPE = BatchShape(num_tokens=96, num_rows=12, num_heads=6, num_kv_heads=2, head_dim=16, page_size=4, max_model_len=160)
SM_SCALE = 0.25
BACKEND = CpuBackend(query_block=16, keys_per_chunk=8)
SCENARIOS = {
    "decode_only": [(5, 1), (130, 1), (17, 1), (60, 1), (0, 1), (99, 1), (31, 1), (8, 1), (150, 1)],
    "prefill_chunks": [(0, 40), (100, 37)],
    "mixed": [(40, 1), (100, 20), (0, 30), (3, 2), (7, 3), (60, 1), (0, 6), (12, 1)],
    "short_prompts": [(0, 7)] * 12,
}


@functools.partial(quick_jit, static_argnames=("backend", "sliding_window", "soft_cap"), donate_argnames="kv_cache")
def _forward(backend, q, k, v, kv_cache, md, sliding_window, soft_cap):
    return backend.forward(q, k, v, kv_cache, md, sm_scale=SM_SCALE, sliding_window=sliding_window, soft_cap=soft_cap)


def _run(backend, batch, sliding_window=None, soft_cap=None) -> tuple[np.ndarray, np.ndarray]:
    """The backend's output and written cache ([2, P, S, K, H]); the batch's NaN poison
    outside the rows' keys is zeroed, since both jnp backends read whole chunks."""
    q, k, v = (jnp.asarray(x) for x in (batch.q, batch.k, batch.v))
    kv_cache = jnp.transpose(jnp.asarray(np.nan_to_num(batch.kv_cache)), (0, 2, 3, 1, 4))
    out, written = _forward(backend, q, k, v, kv_cache, batch.md, sliding_window, soft_cap)
    return np.asarray(out), np.asarray(written)


@pytest.mark.parametrize(("window", "cap"), [(None, None), (11, 3.0)])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_dense_attention(scenario, window, cap):
    batch = make_batch(SCENARIOS[scenario], SHAPE, seed=len(scenario))
    out, _ = _run(BACKEND, batch, window, cap)
    num_real = batch.real_tokens()
    assert relative_error(out[:num_real], dense_attention(batch, SM_SCALE, window, cap)[:num_real]) < 1e-5
    np.testing.assert_array_equal(out[num_real:], 0.0)


@pytest.mark.parametrize("scenario", ["decode_only", "mixed"])
def test_blocks_of_at_most_row_slots_tokens_walk_rows_only(scenario):
    """A block no longer than `row_slots` (a 1-token decode bucket's) spans at most that many
    rows, so it takes the row walk without a run-time choice."""
    batch = make_batch(SCENARIOS[scenario], SHAPE, seed=5)
    out, _ = _run(CpuBackend(query_block=4, keys_per_chunk=8, row_slots=4), batch, 11, 3.0)
    num_real = batch.real_tokens()
    assert relative_error(out[:num_real], dense_attention(batch, SM_SCALE, 11, 3.0)[:num_real]) < 1e-5


def test_writes_the_cache_as_the_reference_does():
    batch = make_batch(SCENARIOS["mixed"], SHAPE, seed=3)
    out, written = _run(BACKEND, batch, 11)
    expected_out, expected_written = _run(ReferenceBackend(keys_per_chunk=8), batch, 11)
    np.testing.assert_array_equal(written, expected_written)
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-6)


def test_default_sizes_match_the_reference():
    """The serving sizes (16-token blocks, 128-key chunks)."""
    batch = make_batch(SCENARIOS["mixed"], SHAPE, seed=4)
    out, _ = _run(CpuBackend(), batch)
    num_real = batch.real_tokens()
    assert relative_error(out[:num_real], dense_attention(batch, SM_SCALE)[:num_real]) < 1e-5


def test_is_the_cpu_default_at_serving_budgets():
    assert default_backend_name() == default_backend_name(512) == "cpu"
    assert default_backend_name(256) == "reference"
    assert isinstance(get_attention_backend(None), CpuBackend)
    assert get_attention_backend("reference").kv_cache_axes == CpuBackend.kv_cache_axes


def test_engine_generates_like_transformers(tmp_path):
    """A tiny engine on the CPU backend (12 requests: blocks of a few prefill rows walk them,
    blocks of the decode rows gather) against transformers' float32 model: greedy tokens
    equal, or at the first difference each side's token in the other's top 5; up to there
    the top-5 logprobs within 1e-3."""
    hf_model = save_tiny_llama(tmp_path, 2, seed=2)
    prompts = PROMPTS + [{"prompt_token_ids": [(5 * i + j) % 290 + 2 for j in range(3 + i)]} for i in range(8)]
    args = dict(ENGINE_ARGS, max_num_seqs=12, max_num_batched_tokens=64, num_gpu_blocks_override=64)
    llm = LLM(str(tmp_path), attention_backend="cpu", **args)
    worker = llm.llm_engine.engine_core.engine_core.model_executor.worker
    assert isinstance(worker.backend, CpuBackend)
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    llm.shutdown()
    assert_greedy_like_transformers(hf_model, prompts, outputs, atol=1e-3)
