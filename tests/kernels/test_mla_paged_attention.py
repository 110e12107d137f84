"""The Pallas MLA paged attention kernel in interpret mode against vjx/attention/mla.py.

A ragged step: decode rows over several pages (split into segments and not), a chunked
prefill continuing a cached prefix, a fresh prompt, a padding row and padding tokens. Blocks
are drawn in random order (never block 0, the scratch block). The step's latents are written
as mla.py writes them, then the kernel and the reference attend over the same cache. Small
tiles and a small split target make short rows walk several tiles and split their keys, as
long rows do on a GPU with the default knobs.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import relative_error
from tests.helpers.quick_compile import quick_jit
from vjx.attention.metadata import AttentionMetadata
from vjx.attention.mla import latent_attention, write_latent
from vjx.kernels.mla_paged_attention import MlaLaunch, MlaTuning, mla_paged_attention

BLOCK_SIZE = 16  # S
# Two head groups per launch, 16-key tiles, up to 4 segments a decode row.
TUNING = MlaTuning(
    decode=MlaLaunch(heads=8, block_k=16),
    prefill=MlaLaunch(heads=8, tokens=4, block_k=16),
    decode_programs=16,
    max_kv_splits=4,
    min_tiles_per_split=1,
)
# (cached tokens, new tokens) per row; the rows past them are padding.
SCENARIOS = {
    # A decode over 151 keys (10 pages, 3 segments), a chunked prefill, a fresh prompt, a decode
    # of one tile (one segment) and one of 71 keys (3 segments); 6 padding tokens.
    "mixed": [(150, 1), (40, 25), (0, 30), (3, 1), (70, 1)],
    "decode_only": [(200, 1), (5, 1)],  # 4 segments and 1
    "prefill_only": [(0, 40), (17, 24)],
}
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
GPU_TOLERANCE = {jnp.float32: 2e-3, jnp.bfloat16: 2e-2}
"""On the GPU float32 dots run in TF32, in the kernel (Triton's default) and in XLA's reference
alike: the two differ by a few 1e-4 (3.4e-4 on an H100 at DeepSeek-V3's widths)."""


@dataclasses.dataclass(frozen=True)
class StepShape:
    num_tokens: int = 64  # T
    num_rows: int = 6  # R
    num_heads: int = 16  # N
    latent_dim: int = 64 + 16  # Lk
    page_size: int = BLOCK_SIZE  # S
    max_model_len: int = 256


SHAPE = StepShape()


@dataclasses.dataclass(frozen=True)
class Step:
    requests: list
    q_latent: np.ndarray  # [T, N, Lk]
    latent: np.ndarray  # [T, Lk]: this step's latents
    kv_cache: np.ndarray  # [P, S, Lk] before the write; stale random latents in every slot
    md: AttentionMetadata
    owned: np.ndarray  # [P * S] bool: the slots holding one of a row's keys after the write

    def real_tokens(self) -> int:
        return sum(num_new for _, num_new in self.requests)


def make_step(requests, shape: StepShape = SHAPE, seed: int = 0) -> Step:
    """Row r holds request r (blocks in random order), later rows are padding; the padding
    tokens write to the scratch block 0."""
    rng = np.random.default_rng(seed)
    s = shape
    width = -(-s.max_model_len // s.page_size)
    num_blocks = s.num_rows * width + 1
    free_blocks = list(rng.permutation(np.arange(1, num_blocks)))
    query_start_loc = np.zeros(s.num_rows + 1, np.int32)
    seq_lens = np.zeros(s.num_rows, np.int32)
    block_tables = np.zeros((s.num_rows, width), np.int32)
    slot_mapping = np.arange(s.num_tokens, dtype=np.int32) % s.page_size
    owned = np.zeros(num_blocks * s.page_size, bool)
    start = 0
    for row, (num_cached, num_new) in enumerate(requests):
        seq_len = num_cached + num_new
        ids = np.asarray([free_blocks.pop() for _ in range(-(-seq_len // s.page_size))], np.int32)
        block_tables[row, : len(ids)] = ids
        positions = np.arange(seq_len)
        slots = ids[positions // s.page_size] * s.page_size + positions % s.page_size
        owned[slots] = True
        slot_mapping[start : start + num_new] = slots[num_cached:]
        seq_lens[row] = seq_len
        start += num_new
        query_start_loc[row + 1] = start
    query_start_loc[len(requests) + 1 :] = start
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(slot_mapping),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(block_tables),
        num_seqs=jnp.asarray([len(requests)], np.int32),
    )
    return Step(
        requests=list(requests),
        q_latent=rng.standard_normal((s.num_tokens, s.num_heads, s.latent_dim), np.float32),
        latent=rng.standard_normal((s.num_tokens, s.latent_dim), np.float32),
        kv_cache=rng.standard_normal((num_blocks, s.page_size, s.latent_dim), np.float32),
        md=md,
        owned=owned,
    )


@functools.partial(quick_jit, static_argnames=("sm_scale", "kv_lora_rank", "tuning", "interpret"))
def kernel(q_latent, latent, kv_cache, md, sm_scale, kv_lora_rank, tuning, interpret=True):
    """The step's write as mla.py does it, then the kernel."""
    kv_cache = write_latent(kv_cache, latent, md.slot_mapping)
    return mla_paged_attention(
        q_latent, kv_cache, md, sm_scale=sm_scale, kv_lora_rank=kv_lora_rank, tuning=tuning, interpret=interpret
    )


@functools.partial(quick_jit, static_argnames=("sm_scale", "kv_lora_rank"))
def reference(q_latent, latent, kv_cache, md, sm_scale, kv_lora_rank):
    kv_cache = write_latent(kv_cache, latent, md.slot_mapping)
    return latent_attention(q_latent, kv_cache, md, sm_scale=sm_scale, kv_lora_rank=kv_lora_rank)


def inputs(step: Step, dtype, kv_cache=None) -> tuple:
    kv_cache = step.kv_cache if kv_cache is None else kv_cache
    return tuple(jnp.asarray(x, dtype) for x in (step.q_latent, step.latent, kv_cache)) + (step.md,)


def check(step: Step, dtype, kv_lora_rank: int, tuning: MlaTuning | None, interpret: bool = True) -> np.ndarray:
    """The kernel's output against the reference's, within TOLERANCE; padding tokens get 0."""
    sm_scale = step.q_latent.shape[-1] ** -0.5
    out = kernel(*inputs(step, dtype), sm_scale, kv_lora_rank, tuning, interpret)
    expected = reference(*inputs(step, dtype), sm_scale, kv_lora_rank)
    out, expected = np.asarray(out, np.float32), np.asarray(expected, np.float32)
    num_real = step.real_tokens()
    assert out.shape == (*step.q_latent.shape[:2], kv_lora_rank)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    tolerance = (TOLERANCE if interpret else GPU_TOLERANCE)[dtype]
    assert relative_error(out[:num_real], expected[:num_real]) < tolerance
    assert np.all(out[num_real:] == 0.0), "padding tokens must get 0"
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_reference(scenario, dtype):
    check(make_step(SCENARIOS[scenario]), dtype, 64, TUNING)


def test_reads_only_the_rows_keys():
    """Every slot no row owns (stale tails, other blocks, scratch block 0) poisoned with NaN:
    the output is unchanged, bit for bit."""
    step = make_step(SCENARIOS["mixed"], seed=1)
    out = check(step, jnp.float32, 64, TUNING)
    poisoned = step.kv_cache.reshape(-1, SHAPE.latent_dim).copy()
    poisoned[~step.owned] = np.nan
    poisoned = poisoned.reshape(step.kv_cache.shape)
    sm_scale = SHAPE.latent_dim**-0.5
    out_poisoned = kernel(*inputs(step, jnp.float32, poisoned), sm_scale, 64, TUNING)
    np.testing.assert_array_equal(np.asarray(out_poisoned), out)


def test_default_tuning():
    """The shipped knobs (16 heads x 32 keys, 4 query tokens a prefill block, 32 decode
    programs) over rows of several tiles."""
    check(make_step(SCENARIOS["mixed"], seed=2), jnp.float32, 64, MlaTuning())


def test_deepseek_v3_widths():
    """The real latent (512 + 64) on a few tokens: a split decode, a short prefill chunk."""
    tuning = dataclasses.replace(TUNING, decode=MlaLaunch(heads=16, block_k=16))
    step = make_step([(100, 1), (20, 5)], StepShape(num_tokens=8, latent_dim=512 + 64), seed=3)
    check(step, jnp.bfloat16, 512, tuning)


def test_fp8_cache():
    """An fp8 cache (mla.py writes the latents saturated, unscaled) read as bfloat16."""
    step = make_step(SCENARIOS["mixed"], seed=4)
    q_latent, latent, kv_cache, md = inputs(step, jnp.bfloat16)
    kv_cache = kv_cache.astype(jnp.float8_e4m3fn)
    sm_scale = SHAPE.latent_dim**-0.5
    out = np.asarray(kernel(q_latent, latent, kv_cache, md, sm_scale, 64, TUNING), np.float32)
    expected = np.asarray(reference(q_latent, latent, kv_cache, md, sm_scale, 64), np.float32)
    num_real = step.real_tokens()
    assert relative_error(out[:num_real], expected[:num_real]) < 2e-2
    assert np.all(out[num_real:] == 0.0)


@pytest.mark.parametrize("kv_dtype", [jnp.bfloat16, jnp.float32, jnp.float8_e4m3fn], ids=["bf16", "f32", "fp8"])
def test_lowers_to_triton(kv_dtype):
    """Both launches lower to Triton IR for CUDA at DeepSeek-V3 widths and the shipped knobs
    (the Pallas -> Triton lowering runs on CPU; only Triton's compile needs the GPU)."""
    step = make_step([(4000, 1), (1000, 256)], StepShape(512, 8, 128, 512 + 64, 16, 4608))
    q_latent, _, kv_cache, md = inputs(step, jnp.float32 if kv_dtype == jnp.float32 else jnp.bfloat16)

    def attend(q_latent, kv_cache, *md_fields):  # metadata rebuilt inside: `lower` unflattens no pytree
        md = AttentionMetadata(*md_fields)
        return mla_paged_attention(q_latent, kv_cache, md, sm_scale=0.04, kv_lora_rank=512)

    md_fields = [getattr(md, field.name) for field in dataclasses.fields(md)]
    traced = jax.jit(attend).trace(q_latent, kv_cache.astype(kv_dtype), *md_fields)
    lowered = traced.lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("@__gpu$xla.gpu.triton(") == 2


@pytest.mark.parametrize(
    ("latent_dim", "kv_lora_rank", "tuning", "argument"),
    [
        (80, 48, TUNING, "kv_lora_rank"),
        (72, 64, TUNING, "qk_rope_head_dim"),
        (80, 64, MlaTuning(decode=MlaLaunch(heads=32)), "tuning.decode.heads"),
    ],
)
def test_bad_shapes_raise(latent_dim, kv_lora_rank, tuning, argument):
    q_latent = jnp.zeros((8, 48, latent_dim), jnp.float32)  # 48 heads: 32 does not divide them
    kv_cache = jnp.zeros((4, BLOCK_SIZE, latent_dim), jnp.float32)
    md = make_step([(3, 1)], StepShape(num_tokens=8, latent_dim=latent_dim)).md
    with pytest.raises(ValueError, match=argument):
        mla_paged_attention(q_latent, kv_cache, md, sm_scale=1.0, kv_lora_rank=kv_lora_rank, tuning=tuning)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"heads": 12}, "heads"), ({"block_k": 8}, "block_k"), ({"num_warps": 3}, "num_warps")],
)
def test_bad_launch_raises(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        MlaLaunch(**kwargs)
