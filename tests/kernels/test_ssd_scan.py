"""The Pallas SSD scan kernel in interpret mode against vjx/mamba/ssd.py's chunked form.

A ragged step: a decode row, a chunked prefill continuing its state over chunks of 16, 16
and 5 tokens, a fresh prompt (zero state) whose last chunk ends among the padding tokens,
then two padding rows and 7 padding tokens. Every row starts from a nonzero state but the
fresh prompt's; the padding rows' states must come back bit for bit and the padding tokens'
outputs must be 0. The padding tokens' inputs are NaN, so a load past a row's end that is
not masked turns the result to NaN.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.attention_batches import relative_error
from tests.helpers.quick_compile import quick_jit
from vjx.attention.metadata import AttentionMetadata
from vjx.kernels.ssd_scan import SsdTuning, mamba_chunk_scan_combined
from vjx.mamba import ssd
from vjx.mamba.ssd import SsdInputs

NUM_TOKENS = 64  # T
NUM_ROWS = 5  # R
NUM_HEADS = 4  # H
HEAD_DIM = 32  # P
NUM_GROUPS = 2  # G
STATE_DIM = 16  # N
CHUNK_SIZE = 16
DT_LIMIT = (0.005, 0.1)
# (cached tokens, new tokens) per row; the rows past them are padding.
REQUESTS = [(37, 1), (16, 37), (0, 19)]
DECODE_REQUESTS = [(37, 1), (5, 1), (0, 1)]
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
# (chunk_size, tuning): the default knobs (one program a head, the whole head dim); two heads
# a program and two column blocks a head; kernel chunks of 16 inside the reference's of 32.
TUNINGS = {
    "default": (CHUNK_SIZE, SsdTuning()),
    "two_heads_two_blocks": (CHUNK_SIZE, SsdTuning(heads=2, block_p=16)),
    "kernel_chunk_16_of_32": (32, SsdTuning(block_t=16)),
}


@dataclasses.dataclass(frozen=True)
class Step:
    requests: list[tuple[int, int]]
    inputs: SsdInputs
    ssm_state: np.ndarray  # [R, H, P, N]: each row's state before the step
    md: AttentionMetadata

    def real_tokens(self) -> int:
        return sum(num_new for _, num_new in self.requests)


def make_step(requests: list[tuple[int, int]], seed: int = 0, head_dim: int = HEAD_DIM) -> Step:
    """Magnitudes as in a trained Mamba2: softplus(dt_bias) in [0.001, 0.1], A in [-16, -1]."""
    rng = np.random.default_rng(seed)
    query_start_loc = np.zeros(NUM_ROWS + 1, np.int32)
    seq_lens = np.zeros(NUM_ROWS, np.int32)
    for row, (num_cached, num_new) in enumerate(requests):
        seq_lens[row] = num_cached + num_new
        query_start_loc[row + 1] = query_start_loc[row] + num_new
    query_start_loc[len(requests) + 1 :] = query_start_loc[len(requests)]
    md = AttentionMetadata(
        slot_mapping=jnp.zeros(NUM_TOKENS, jnp.int32),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(np.arange(NUM_ROWS, dtype=np.int32)[:, None] + 1),
        num_seqs=jnp.asarray([len(requests)], np.int32),
    )
    dt_init = rng.uniform(0.001, 0.1, NUM_HEADS)
    group_shape = (NUM_TOKENS, NUM_GROUPS, STATE_DIM)
    inputs = SsdInputs(
        x_THP=rng.standard_normal((NUM_TOKENS, NUM_HEADS, head_dim), np.float32),
        dt_TH=rng.standard_normal((NUM_TOKENS, NUM_HEADS), np.float32),
        A_H=-rng.uniform(1, 16, NUM_HEADS).astype(np.float32),
        B_TGN=rng.standard_normal(group_shape, np.float32),
        C_TGN=rng.standard_normal(group_shape, np.float32),
        D_H=rng.standard_normal(NUM_HEADS, np.float32),
        dt_bias_H=(dt_init + np.log(-np.expm1(-dt_init))).astype(np.float32),
    )
    num_real = int(query_start_loc[-1])
    for per_token in (inputs.x_THP, inputs.dt_TH, inputs.B_TGN, inputs.C_TGN):
        per_token[num_real:] = np.nan
    ssm_state = rng.standard_normal((NUM_ROWS, NUM_HEADS, head_dim, STATE_DIM), np.float32)
    for row, (num_cached, _) in enumerate(requests):
        if not num_cached:
            ssm_state[row] = 0.0  # a fresh row starts from zeros, as the layer gathers it
    return Step(list(requests), inputs, ssm_state, md)


def check(step: Step, dtype, chunk_size: int, tuning: SsdTuning | None) -> None:
    """The kernel's outputs and final states against the reference's, within TOLERANCE;
    padding tokens get 0 and padding rows keep their states exactly."""
    inputs = SsdInputs(*(jnp.asarray(v, dtype) for v in step.inputs))
    ssm_state = jnp.asarray(step.ssm_state)
    kwargs = dict(chunk_size=chunk_size, dt_limit=DT_LIMIT)
    y, state = mamba_chunk_scan_combined(inputs, ssm_state, step.md, **kwargs, tuning=tuning, interpret=True)
    y_ref, state_ref = quick_jit(ssd.mamba_chunk_scan_combined, static_argnames=tuple(kwargs))(
        inputs, ssm_state, step.md, **kwargs
    )
    assert y.dtype == jnp.dtype(dtype) and state.dtype == jnp.float32
    y, y_ref = np.asarray(y, np.float32), np.asarray(y_ref, np.float32)
    state, state_ref = np.asarray(state), np.asarray(state_ref)
    num_real, num_real_rows = step.real_tokens(), len(step.requests)
    assert relative_error(y[:num_real], y_ref[:num_real]) < TOLERANCE[dtype]
    assert relative_error(state[:num_real_rows], state_ref[:num_real_rows]) < TOLERANCE[dtype]
    assert np.all(y[num_real:] == 0.0), "padding tokens must get 0"
    np.testing.assert_array_equal(state[num_real_rows:], step.ssm_state[num_real_rows:])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_matches_reference(tuning, dtype):
    chunk_size, knobs = TUNINGS[tuning]
    check(make_step(REQUESTS), dtype, chunk_size, knobs)


def test_decode_only():
    check(make_step(DECODE_REQUESTS, seed=1), jnp.float32, CHUNK_SIZE, None)


def test_full_step_without_padding():
    """Rows fill all T tokens (no padding tokens, the last chunk ends at T) and every row is real."""
    requests = [(3, 20), (0, 1), (40, 9), (7, 17), (1, 17)]
    check(make_step(requests, seed=2), jnp.float32, CHUNK_SIZE, SsdTuning(heads=2))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_lowers_to_triton(dtype):
    """The launch lowers to Triton IR for CUDA at Mamba2-2.7B widths (80 heads, head dim 64,
    state 128, one group, chunk 256) and the default knobs (the Pallas -> Triton lowering
    runs on CPU; only Triton's compile needs the GPU)."""
    num_tokens, num_rows, num_heads, head_dim, state_dim = 512, 8, 80, 64, 128
    query_start_loc = np.array([0, 1, 2, 300, 500, 500, 500, 500, 500], np.int32)
    md_fields = (
        jnp.zeros(num_tokens, jnp.int32),
        jnp.asarray(query_start_loc),
        jnp.zeros(num_rows, jnp.int32),
        jnp.ones((num_rows, 1), jnp.int32),
        jnp.asarray([4], jnp.int32),
    )
    inputs = (
        jnp.zeros((num_tokens, num_heads, head_dim), dtype),
        jnp.zeros((num_tokens, num_heads), dtype),
        jnp.zeros(num_heads, jnp.float32),
        jnp.zeros((num_tokens, 1, state_dim), dtype),
        jnp.zeros((num_tokens, 1, state_dim), dtype),
        jnp.zeros(num_heads, jnp.float32),
        jnp.zeros(num_heads, jnp.float32),
        jnp.zeros((num_rows, num_heads, head_dim, state_dim), jnp.float32),
    )

    def scan(*args):  # metadata rebuilt inside: `lower` unflattens no pytree
        *inputs, ssm_state = args[:8]
        return mamba_chunk_scan_combined(SsdInputs(*inputs), ssm_state, AttentionMetadata(*args[8:]), chunk_size=256)

    lowered = jax.jit(scan).trace(*inputs, *md_fields).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("@__gpu$xla.gpu.triton(") == 1


@pytest.mark.parametrize(
    ("head_dim", "state_dim", "chunk_size", "tuning", "argument"),
    [
        (24, 16, 16, None, "head_dim"),
        (16, 8, 16, None, "state dim"),
        (16, 16, 24, None, "chunk_size"),
        (16, 16, 8, None, "chunk_size"),
        (16, 16, 16, SsdTuning(heads=4), "tuning.heads"),  # 4 heads in 2 groups: 2 a group
    ],
)
def test_bad_shapes_raise(head_dim, state_dim, chunk_size, tuning, argument):
    num_tokens = 8
    inputs = SsdInputs(
        x_THP=jnp.zeros((num_tokens, NUM_HEADS, head_dim)),
        dt_TH=jnp.zeros((num_tokens, NUM_HEADS)),
        A_H=jnp.zeros(NUM_HEADS),
        B_TGN=jnp.zeros((num_tokens, NUM_GROUPS, state_dim)),
        C_TGN=jnp.zeros((num_tokens, NUM_GROUPS, state_dim)),
        D_H=jnp.zeros(NUM_HEADS),
        dt_bias_H=jnp.zeros(NUM_HEADS),
    )
    ssm_state = jnp.zeros((NUM_ROWS, NUM_HEADS, head_dim, state_dim))
    md = make_step(DECODE_REQUESTS).md
    with pytest.raises(ValueError, match=argument):
        mamba_chunk_scan_combined(inputs, ssm_state, md, chunk_size=chunk_size, tuning=tuning, interpret=True)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"block_t": 8}, "block_t"),
        ({"block_p": 48}, "block_p"),
        ({"heads": 0}, "heads"),
        ({"num_warps": 3}, "num_warps"),
        ({"num_stages": 0}, "num_stages"),
    ],
)
def test_bad_tuning_raises(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SsdTuning(**kwargs)
