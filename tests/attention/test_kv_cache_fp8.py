"""kv_cache_dtype="fp8": every backend writes float8_e4m3fn K/V (divided by the layer's scales)
and reads them back inside its kernel; attention over the fp8 cache stays within a stated
tolerance of attention over a bfloat16 cache, and the same KV memory holds twice the blocks.

The batch: one ragged step (decodes, a chunked prefill, a prefill) with standard-normal q/k/v,
each new token's slot stale before the write. Scales 1.0 (vLLM's default) and 0.02 / 0.03 (keys
stored up to ~230, distinct so a swap or a dropped scale shows).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.attention_batches import BatchShape, dense_attention, make_batch, relative_error
from tests.helpers.quick_compile import quick_jit
from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, assert_greedy_like_transformers, save_tiny_llama
from tests.helpers.tpu_layout import from_gpu_layout
from vjx import LLM, EngineArgs, SamplingParams
from vjx.attention.cpu import CpuBackend
from vjx.attention.metadata import AttentionMetadata
from vjx.attention.pallas_gpu import PallasGpuBackend
from vjx.attention.pallas_tpu import PallasTpuBackend
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.kernels.kv_cache_write import write_kv_cache
from vjx.kernels.tuning import AttentionTuning, KernelTuning
from vjx.sharding.mesh import make_mesh
from vjx.worker.worker import Worker

FP8 = jnp.float8_e4m3fn
SHAPE = BatchShape(num_tokens=64, num_rows=4, num_heads=8, num_kv_heads=2, head_dim=64, page_size=16, max_model_len=128)
REQUESTS = [(20, 1), (50, 30), (0, 12), (100, 1)]
SM_SCALE = 0.125
BACKENDS = {
    "reference": ReferenceBackend(),
    "cpu": CpuBackend(query_block=16, keys_per_chunk=32),
    "pallas_gpu": PallasGpuBackend(
        tuning=AttentionTuning(
            decode=KernelTuning(block_k=16), prefill=KernelTuning(block_m=32, block_k=16), decode_programs=8
        ),
        interpret=True,
    ),
}
SCALES = {"unit": (1.0, 1.0), "calibrated": (0.02, 0.03)}
FP8_TOLERANCE = 0.05
"""Relative (Frobenius) error of an fp8 cache's output against a bfloat16 cache's and against
the float64 oracle. Measured 0.033 for both backends and both scales (0.037 for the TPU
adapter's one-row batch); the bfloat16 cache itself is 0.0015 from the oracle. e4m3 keeps 3
mantissa bits, about 3% RMS error per element."""


@functools.partial(quick_jit, static_argnames=("backend",), donate_argnames=("kv_cache",))
def _forward(backend, q, k, v, kv_cache, md, k_scale, v_scale):
    return backend.forward(q, k, v, kv_cache, md, sm_scale=SM_SCALE, k_scale=k_scale, v_scale=v_scale)


def _stale_cache(batch) -> np.ndarray:
    """The batch's cache ([2, K, P, S, H], 0 for NaN) with this step's slots stale, so the
    output depends on the write."""
    cache = np.nan_to_num(batch.kv_cache)
    slots = np.asarray(batch.md.slot_mapping)[: batch.real_tokens()]
    cache[:, :, slots // SHAPE.page_size, slots % SHAPE.page_size] = -7.0
    return cache


def _stored(x: np.ndarray, scale: float) -> np.ndarray:
    """What an fp8 cache holds for the values x (float32 numpy, as an independent oracle)."""
    return np.asarray(jnp.asarray(np.clip(x / np.float32(scale), -448, 448), FP8))


def _stored_cache(cache: np.ndarray, scales: tuple[float, float]) -> np.ndarray:
    """A [2, ...] cache of keys and values as an fp8 cache holds it."""
    return np.stack([_stored(cache[0], scales[0]), _stored(cache[1], scales[1])])


def _in_layout(name: str, cache_KPSH: np.ndarray, dtype) -> jax.Array:
    """A [2, K, P, S, H] cache in backend `name`'s layout and `dtype` (fp8: already stored)."""
    cache = jnp.asarray(cache_KPSH, dtype)
    return jnp.transpose(cache, (0, 2, 3, 1, 4)) if name in ("reference", "cpu") else cache


def _run(name: str, batch, dtype, scales) -> tuple[np.ndarray, np.ndarray]:
    """Backend `name`'s output over a cache of `dtype`, and its cache back in [2, K, P, S, H]."""
    cache = _stale_cache(batch)
    if dtype == FP8:
        cache = _stored_cache(cache, scales)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (batch.q, batch.k, batch.v))
    k_scale, v_scale = (jnp.float32(s) for s in scales)
    out, written = _forward(BACKENDS[name], q, k, v, _in_layout(name, cache, dtype), batch.md, k_scale, v_scale)
    assert written.dtype == dtype
    if name in ("reference", "cpu"):
        written = jnp.transpose(written, (0, 3, 1, 2, 4))
    return np.asarray(out, np.float32)[: batch.real_tokens()], np.asarray(written)


@pytest.fixture(scope="module")
def batch():
    return make_batch(REQUESTS, SHAPE, jnp.bfloat16, seed=5)


@pytest.fixture(scope="module")
def bf16_out(batch):
    """The reference backend's output over a bfloat16 cache (which ignores the scales)."""
    return _run("reference", batch, jnp.bfloat16, SCALES["unit"])[0]


@pytest.mark.parametrize("scales", SCALES.values(), ids=SCALES.keys())
@pytest.mark.parametrize("name", BACKENDS)
def test_fp8_cache_attends_like_a_bfloat16_cache(name, scales, batch, bf16_out):
    fp8_out, fp8_cache = _run(name, batch, FP8, scales)
    error = relative_error(fp8_out, bf16_out)
    assert error < FP8_TOLERANCE, error
    expected = dense_attention(batch, SM_SCALE)[: batch.real_tokens()]
    assert relative_error(fp8_out, expected) < FP8_TOLERANCE
    # The write stored this step's k/v divided by their scales (block 0 is the padding's scratch).
    stored = _stored_cache(np.nan_to_num(batch.kv_cache), scales)
    np.testing.assert_array_equal(fp8_cache[:, :, 1:], stored[:, :, 1:])


def test_pallas_kernel_reads_fp8_as_the_reference_does(batch):
    """Over one fp8 cache, the kernel (scales folded into scores and output) and the reference
    (each chunk dequantized) differ only by bfloat16 rounding."""
    scales = SCALES["calibrated"]
    kernel_out, _ = _run("pallas_gpu", batch, FP8, scales)
    reference_out, _ = _run("reference", batch, FP8, scales)
    assert relative_error(kernel_out, reference_out.astype(np.float64)) < 1e-2


def test_tpu_adapter_reads_fp8():
    """The TPU adapter through JAX's jnp reference of its kernel (eager, compiling each op for
    each row's shapes: so one row, a chunk after cached keys) against the float64 oracle."""
    batch = make_batch([(20, 9)], SHAPE, jnp.bfloat16, seed=6)
    scales = SCALES["calibrated"]
    cache = _stale_cache(batch)
    stored = _stored_cache(cache, scales)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (batch.q, batch.k, batch.v))
    k_scale, v_scale = (jnp.float32(s) for s in scales)
    out, kv_pages = PallasTpuBackend(use_reference=True).forward(
        q,
        k,
        v,
        from_gpu_layout(jnp.asarray(stored, FP8)),
        batch.md,
        sm_scale=SM_SCALE,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    assert kv_pages.dtype == FP8
    expected = dense_attention(batch, SM_SCALE)[: batch.real_tokens()]
    assert relative_error(np.asarray(out, np.float32)[: batch.real_tokens()], expected) < FP8_TOLERANCE


def test_sharded_backend_passes_the_scales(batch):
    """Under tensor parallelism 2 each device reads its KV heads with the replicated scales."""
    scales = SCALES["calibrated"]
    expected, _ = _run("reference", batch, FP8, scales)
    cache = np.nan_to_num(batch.kv_cache)
    stored = _stored_cache(cache, scales)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (batch.q, batch.k, batch.v))
    k_scale, v_scale = (jnp.float32(s) for s in scales)
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=2))
    with jax.set_mesh(mesh):
        out, _ = _forward(
            ShardedBackend(ReferenceBackend()),
            q,
            k,
            v,
            _in_layout("reference", stored, FP8),
            batch.md,
            k_scale,
            v_scale,
        )
    out = np.asarray(out, np.float32)[: batch.real_tokens()]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize(("window", "cap"), [(None, None), (1000, 30.0)])
def test_compiled_kernels_read_fp8_on_the_gpu(window, cap):
    """The Triton-compiled kernels at real sizes (decode rows of thousands of keys split into
    segments, prefill rows over many query blocks) against the float64 oracle; the cache is
    NaN outside the rows' keys, so a stray read shows."""
    shape = BatchShape(1280, 8, 32, 8, 128, 16, 4608)
    batch = make_batch([(4000, 1), (2500, 1), (4400, 1), (1000, 300), (0, 700), (33, 200)], shape, jnp.bfloat16)
    scales = SCALES["calibrated"]
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (batch.q, batch.k, batch.v))
    cache = jnp.asarray(_stored_cache(batch.kv_cache, scales), FP8)
    k_scale, v_scale = (jnp.float32(s) for s in scales)
    out, _ = PallasGpuBackend().forward(
        q,
        k,
        v,
        cache,
        batch.md,
        sm_scale=128**-0.5,
        sliding_window=window,
        soft_cap=cap,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    out = np.asarray(out, np.float32)
    num_real = batch.real_tokens()
    expected = dense_attention(batch, 128**-0.5, sliding_window=window, soft_cap=cap)
    assert relative_error(out[:num_real], expected[:num_real]) < FP8_TOLERANCE
    assert np.all(out[num_real:] == 0.0)


def test_write_saturates_instead_of_overflowing():
    """e4m3fn has no infinity: values past 448 * scale are stored as +-448, not NaN."""
    cache = jnp.zeros((2, 1, 2, 16, 16), FP8)
    rows = jnp.asarray([[[1000.0] * 8 + [-1000.0] * 8]], jnp.bfloat16)  # [T=1, K=1, H=16]
    written = write_kv_cache(cache, rows, rows / 4, jnp.asarray([16], jnp.int32), jnp.float32(1.0), jnp.float32(0.5))
    np.testing.assert_array_equal(np.asarray(written[:, 0, 1, 0], np.float32), [[448.0] * 8 + [-448.0] * 8] * 2)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(model directory, the transformers model it holds)."""
    path = tmp_path_factory.mktemp("tiny-llama-fp8-kv")
    return path, save_tiny_llama(path, 2, seed=1)


def _worker(model_dir, kv_cache_dtype: str) -> Worker:
    args = EngineArgs(str(model_dir), dtype="bfloat16", kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=1 << 20)
    return Worker(args.create_engine_config())


@pytest.fixture(scope="module")
def fp8_worker(tiny_llama):
    return _worker(tiny_llama[0], "fp8")


def test_the_same_kv_memory_holds_more_blocks_by_the_element_size(tiny_llama, fp8_worker):
    """fp8 stores one byte an element; "auto" a bf16 model's dtype (two bytes), or float32 on
    the CPU (four): the same memory holds that many times the blocks."""
    auto, fp8 = _worker(tiny_llama[0], "auto"), fp8_worker
    assert {spec.dtype for spec in fp8.kv_cache_specs.values()} == {"float8_e4m3fn"}
    assert auto.kv_cache_dtype == "float32"  # the CPU's cache for a 16-bit model
    ratio = jnp.dtype(auto.kv_cache_dtype).itemsize
    auto_spec, fp8_spec = (next(iter(w.kv_cache_specs.values())) for w in (auto, fp8))
    assert fp8_spec.page_size_bytes * ratio == auto_spec.page_size_bytes
    assert fp8.get_kv_block_bytes() * ratio == auto.get_kv_block_bytes()
    assert fp8.determine_num_available_blocks() == ratio * auto.determine_num_available_blocks()
    assert {cache.dtype for cache in fp8._allocate_kv_caches(4).values()} == {jnp.dtype(FP8)}


def test_attention_layer_scales_reach_its_cache(fp8_worker):
    """Each attention layer holds vLLM's k_scale / v_scale (None, read as 1.0, until a checkpoint
    gives them): set, they divide what the layer's fp8 cache stores, and the output stays."""
    attn = fp8_worker.model.model.layers[0].self_attn
    assert attn.k_scale.get_value() is None and attn.v_scale.get_value() is None
    num_tokens = 16
    x = jnp.asarray(np.random.default_rng(0).standard_normal((num_tokens, 64)), jnp.bfloat16)
    md = AttentionMetadata(
        slot_mapping=jnp.arange(16, 16 + num_tokens, dtype=jnp.int32),  # block 1
        query_start_loc=jnp.asarray([0, num_tokens], jnp.int32),
        seq_lens=jnp.asarray([num_tokens], jnp.int32),
        block_tables=jnp.asarray([[1]], jnp.int32),
        num_seqs=jnp.asarray([1], jnp.int32),
    )
    empty = next(iter(fp8_worker._allocate_kv_caches(2).values()))

    @quick_jit
    def run(graphdef, state):
        return nnx.merge(graphdef, state)(x, jnp.arange(num_tokens, dtype=jnp.int32), empty, md)

    def with_scales(k_scale: float, v_scale: float):
        layer = nnx.clone(attn)
        layer.k_scale.set_value(jnp.float32(k_scale))
        layer.v_scale.set_value(jnp.float32(v_scale))
        return nnx.split(layer)

    out, cache = run(*with_scales(1.0, 1.0))
    scaled_out, scaled_cache = run(*with_scales(0.5, 0.25))
    # Block 1 as stored: the scaled cache holds k / 0.5 and v / 0.25 (equal up to fp8 rounding).
    stored, scaled = (np.asarray(c, np.float32)[:, 1] for c in (cache, scaled_cache))
    np.testing.assert_allclose(scaled * np.float32([0.5, 0.25]).reshape(2, 1, 1, 1), stored, rtol=1 / 16, atol=2**-9)
    # Powers of two move fp8 values by whole exponents: the outputs differ by 0.001 (subnormals).
    assert relative_error(np.asarray(scaled_out, np.float32), np.asarray(out, np.float64)) < 0.01


@pytest.mark.parametrize("value", ["fp8_e5m2", "bfloat16", "int8"])
def test_unknown_kv_cache_dtype_is_refused(value):
    with pytest.raises(
        ValueError, match=rf"^kv_cache_dtype must be one of \['auto', 'fp8', 'fp8_e4m3'\], got '{value}'"
    ):
        EngineArgs(kv_cache_dtype=value)


def test_engine_with_an_fp8_cache_generates_like_transformers(tiny_llama):
    """One tiny engine (float32 model, fp8 cache, chunked prefills and decodes mixed) against
    transformers' float32 model: greedy tokens equal, or at the first difference each side's
    token in the other's top 5; up to there the top-5 logprobs within 0.5 (measured: 0.19)."""
    model_dir, hf_model = tiny_llama
    llm = LLM(str(model_dir), kv_cache_dtype="fp8", **ENGINE_ARGS)
    worker = llm.llm_engine.engine_core.engine_core.model_executor.worker
    assert {cache.dtype for cache in worker.model_runner.kv_caches} == {jnp.dtype(FP8)}
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.shutdown()
    assert_greedy_like_transformers(hf_model, PROMPTS, outputs, atol=0.5)
