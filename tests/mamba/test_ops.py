"""The Mamba2 mixer's ragged ops (vjx/mamba) against a float64 numpy oracle that runs the
recurrences token by token, row by row.

One ragged step: a decode row continuing its stored state, a chunked-prefill row continuing
its stored state across several SSD chunks, a fresh prompt, a two-token step continuing its
state (it starts inside the stored conv window), then a padding row and padding tokens.
Slots are drawn in random order (never slot 0, the scratch slot); every slot, the fresh
prompt's too, holds stale random data that must not be read, and the slots no real row owns
must come back unchanged.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.mamba2.modeling_mamba2 import Mamba2RMSNormGated

from vjx.attention.metadata import AttentionMetadata, is_decode_only
from vjx.mamba.causal_conv1d import causal_conv1d
from vjx.mamba.layernorm_gated import rms_norm_gated
from vjx.mamba.metadata import mamba_rows
from vjx.mamba.ssd import SsdInputs, mamba_chunk_scan_combined, selective_state_update, ssd_scan

NUM_TOKENS = 64  # T
NUM_ROWS = 5  # R
NUM_SLOTS = 9  # S
NUM_HEADS = 4  # H
HEAD_DIM = 8  # P
NUM_GROUPS = 2  # G
STATE_DIM = 16  # N
CONV_CHANNELS = 64  # C
KERNEL_WIDTH = 4  # K
CHUNK_SIZE = 8
DT_LIMIT = (0.005, 0.1)
# (cached tokens, new tokens): a decode, a chunked prefill over chunks of 8, 8 and 5, a fresh
# prompt, a step shorter than the conv window; row 4 is padding.
REQUESTS = [(37, 1), (16, 21), (0, 19), (9, 2)]
DECODE_REQUESTS = [(37, 1), (5, 1), (0, 1)]


@dataclasses.dataclass(frozen=True)
class Step:
    requests: list[tuple[int, int]]
    slots: list[int]
    md: AttentionMetadata


def make_step(requests: list[tuple[int, int]], slots: list[int]) -> Step:
    query_start_loc = np.zeros(NUM_ROWS + 1, np.int32)
    seq_lens = np.zeros(NUM_ROWS, np.int32)
    block_tables = np.zeros((NUM_ROWS, 2), np.int32)
    for row, ((num_cached, num_new), slot) in enumerate(zip(requests, slots, strict=True)):
        block_tables[row, 0] = slot
        seq_lens[row] = num_cached + num_new
        query_start_loc[row + 1] = query_start_loc[row] + num_new
    query_start_loc[len(requests) + 1 :] = query_start_loc[len(requests)]
    md = AttentionMetadata(
        slot_mapping=jnp.zeros(NUM_TOKENS, jnp.int32),
        query_start_loc=jnp.asarray(query_start_loc),
        seq_lens=jnp.asarray(seq_lens),
        block_tables=jnp.asarray(block_tables),
        num_seqs=jnp.asarray([len(requests)], np.int32),
    )
    return Step(requests, slots, md)


def random_step(requests: list[tuple[int, int]], rng: np.random.Generator) -> Step:
    slots = rng.permutation(np.arange(1, NUM_SLOTS))[: len(requests)]
    return make_step(requests, [int(s) for s in slots])


@dataclasses.dataclass(frozen=True)
class ConvLayer:
    weight_KC: np.ndarray
    bias_C: np.ndarray


def random_conv_layer(rng: np.random.Generator) -> ConvLayer:
    weight = rng.standard_normal((KERNEL_WIDTH, CONV_CHANNELS), np.float32) / 2
    return ConvLayer(weight, rng.standard_normal(CONV_CHANNELS, np.float32))


def random_ssd_inputs(rng: np.random.Generator) -> SsdInputs:
    """Magnitudes as in a trained Mamba2: softplus(dt_bias) in [0.001, 0.1], A in [-16, -1]."""
    dt_init = rng.uniform(0.001, 0.1, NUM_HEADS)
    group_shape = (NUM_TOKENS, NUM_GROUPS, STATE_DIM)
    return SsdInputs(
        x_THP=rng.standard_normal((NUM_TOKENS, NUM_HEADS, HEAD_DIM), np.float32),
        dt_TH=rng.standard_normal((NUM_TOKENS, NUM_HEADS), np.float32),
        A_H=-rng.uniform(1, 16, NUM_HEADS).astype(np.float32),
        B_TGN=rng.standard_normal(group_shape, np.float32),
        C_TGN=rng.standard_normal(group_shape, np.float32),
        D_H=rng.standard_normal(NUM_HEADS, np.float32),
        dt_bias_H=(dt_init + np.log(-np.expm1(-dt_init))).astype(np.float32),
    )


def conv_oracle(
    x_TC: np.ndarray, layer: ConvLayer, conv_state: np.ndarray, step: Step
) -> tuple[np.ndarray, np.ndarray]:
    """silu(conv + bias) token by token over (stored state or zeros, the row's tokens)."""
    y_TC, state = np.zeros(x_TC.shape), conv_state.astype(np.float64)
    start = 0
    for (num_cached, num_new), slot in zip(step.requests, step.slots):
        history = state[slot] if num_cached else np.zeros((KERNEL_WIDTH - 1, CONV_CHANNELS))
        inputs = np.concatenate([history, x_TC[start : start + num_new]])
        for i in range(num_new):
            pre = (inputs[i : i + KERNEL_WIDTH] * layer.weight_KC).sum(0) + layer.bias_C
            y_TC[start + i] = pre / (1 + np.exp(-pre))
        state[slot] = inputs[-(KERNEL_WIDTH - 1) :]
        start += num_new
    return y_TC, state


def ssd_oracle(inputs: SsdInputs, ssm_state: np.ndarray, step: Step) -> tuple[np.ndarray, np.ndarray]:
    """h = exp(dt A) h + dt x B^T, y = h C + D x, token by token from the stored state or zero."""
    x, dt_raw, A, B, C, D, dt_bias = (np.asarray(v, np.float64) for v in inputs)
    group = np.arange(NUM_HEADS) // (NUM_HEADS // NUM_GROUPS)
    y, state = np.zeros(x.shape), ssm_state.astype(np.float64)
    start = 0
    for (num_cached, num_new), slot in zip(step.requests, step.slots):
        h = state[slot] if num_cached else np.zeros(state.shape[1:])
        for t in range(start, start + num_new):
            dt = np.clip(np.log1p(np.exp(dt_raw[t] + dt_bias)), *DT_LIMIT)
            h = np.exp(dt * A)[:, None, None] * h + (dt[:, None] * x[t])[..., None] * B[t, group][:, None, :]
            y[t] = np.einsum("hpn,hn->hp", h, C[t, group]) + D[:, None] * x[t]
        state[slot] = h
        start += num_new
    return y, state


def _on_slots(op, **kwargs):
    """`op` as a Mamba layer runs it over its state slots: each row's state gathered from its
    slot (zeros for a row that starts afresh), and the rows' new states written back."""

    def run(*args):
        *inputs, state, md = args
        rows = mamba_rows(md, jax.tree.leaves(inputs)[0].shape[0])
        out, new_states = op(*inputs, rows.initial_states(state), md, **kwargs)
        return out, rows.write_states(state, new_states)

    return jax.jit(run)


_conv = _on_slots(causal_conv1d, activation="silu")
_ssd = _on_slots(ssd_scan, chunk_size=CHUNK_SIZE, dt_limit=DT_LIMIT)
_decode_form = _on_slots(selective_state_update, dt_limit=DT_LIMIT)
_chunked_form = _on_slots(mamba_chunk_scan_combined, chunk_size=CHUNK_SIZE, dt_limit=DT_LIMIT)


def run_conv(x_TC, layer: ConvLayer, conv_state, step: Step) -> tuple[np.ndarray, np.ndarray]:
    y, state = _conv(jnp.asarray(x_TC), jnp.asarray(layer.weight_KC), jnp.asarray(layer.bias_C), conv_state, step.md)
    return np.asarray(y), np.asarray(state)


def run_ssd(form, inputs: SsdInputs, ssm_state, step: Step) -> tuple[np.ndarray, np.ndarray]:
    y, state = form(SsdInputs(*(jnp.asarray(v) for v in inputs)), jnp.asarray(ssm_state), step.md)
    return np.asarray(y), np.asarray(state)


def num_real_tokens(step: Step) -> int:
    return sum(num_new for _, num_new in step.requests)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def assert_step_matches(step: Step, result, expected, state_before: np.ndarray) -> None:
    """Real tokens' outputs and the rows' slots within 1e-5 of the oracle, padding tokens 0,
    every other slot bit for bit as before."""
    (y, state), (expected_y, expected_state) = result, expected
    num_real = num_real_tokens(step)
    assert relative_error(y[:num_real], expected_y[:num_real]) < 1e-5
    assert np.all(y[num_real:] == 0.0), "padding tokens must get 0"
    assert relative_error(state[step.slots], expected_state[step.slots]) < 1e-5
    others = np.setdiff1d(np.arange(NUM_SLOTS), step.slots)
    np.testing.assert_array_equal(state[others], state_before[others])


@pytest.fixture(scope="module")
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="module")
def step(rng) -> Step:
    return random_step(REQUESTS, rng)


def test_rows_of_a_ragged_step():
    step = make_step(REQUESTS, [3, 7, 1, 5])
    rows = mamba_rows(step.md, NUM_TOKENS)
    np.testing.assert_array_equal(rows.token_row[:43], [0] + [1] * 21 + [2] * 19 + [3] * 2)
    np.testing.assert_array_equal(rows.token_offset[:3], [0, 0, 1])
    np.testing.assert_array_equal(rows.token_offset[39:43], [17, 18, 0, 1])
    assert rows.is_real_token.sum() == 43
    np.testing.assert_array_equal(rows.query_lens, [1, 21, 19, 2, 0])
    np.testing.assert_array_equal(rows.state_indices, [3, 7, 1, 5, 0])
    np.testing.assert_array_equal(rows.has_initial_states, [True, True, False, True, False])
    np.testing.assert_array_equal(rows.is_real_row, [True, True, True, True, False])
    assert not is_decode_only(step.md)
    assert is_decode_only(make_step(DECODE_REQUESTS, [3, 7, 1]).md)


def test_conv_matches_the_oracle_on_a_ragged_step(step, rng):
    layer = random_conv_layer(rng)
    x_TC = rng.standard_normal((NUM_TOKENS, CONV_CHANNELS), np.float32)
    conv_state = rng.standard_normal((NUM_SLOTS, KERNEL_WIDTH - 1, CONV_CHANNELS), np.float32)
    result = run_conv(x_TC, layer, conv_state, step)
    assert_step_matches(step, result, conv_oracle(x_TC, layer, conv_state, step), conv_state)
    # The two-token step keeps the last stored input and appends its own two.
    new_state = result[1][step.slots[3]]
    np.testing.assert_array_equal(new_state[0], conv_state[step.slots[3], -1])
    np.testing.assert_array_equal(new_state[1:], x_TC[41:43])


def test_conv_weight_is_torch_conv1d_weight_transposed(rng):
    """weight_KC = Conv1d.weight[:, 0, :].T: a fresh prompt against transformers' causal conv
    (a depthwise Conv1d with K-1 zeros of left padding)."""
    conv = torch.nn.Conv1d(CONV_CHANNELS, CONV_CHANNELS, KERNEL_WIDTH, groups=CONV_CHANNELS, padding=KERNEL_WIDTH - 1)
    x_TC = rng.standard_normal((NUM_TOKENS, CONV_CHANNELS), np.float32)
    with torch.no_grad():
        expected = torch.nn.functional.silu(conv(torch.from_numpy(x_TC[:20].T)[None])[0, :, :20]).numpy().T
        layer = ConvLayer(conv.weight[:, 0, :].T.numpy().copy(), conv.bias.numpy().copy())
    conv_state = np.zeros((NUM_SLOTS, KERNEL_WIDTH - 1, CONV_CHANNELS), np.float32)
    y_TC, _ = run_conv(x_TC, layer, conv_state, make_step([(0, 20)], [2]))
    np.testing.assert_allclose(y_TC[:20], expected, rtol=1e-5, atol=1e-6)


def test_ssd_scan_matches_the_oracle_on_a_ragged_step(step, rng):
    inputs = random_ssd_inputs(rng)
    ssm_state = rng.standard_normal((NUM_SLOTS, NUM_HEADS, HEAD_DIM, STATE_DIM), np.float32)
    result = run_ssd(_ssd, inputs, ssm_state, step)
    assert_step_matches(step, result, ssd_oracle(inputs, ssm_state, step), ssm_state)


def test_a_decode_step_matches_the_oracle_in_both_forms(rng):
    step = random_step(DECODE_REQUESTS, rng)
    inputs = random_ssd_inputs(rng)
    ssm_state = rng.standard_normal((NUM_SLOTS, NUM_HEADS, HEAD_DIM, STATE_DIM), np.float32)
    decode = run_ssd(_decode_form, inputs, ssm_state, step)
    assert_step_matches(step, run_ssd(_ssd, inputs, ssm_state, step), ssd_oracle(inputs, ssm_state, step), ssm_state)
    assert_step_matches(step, decode, ssd_oracle(inputs, ssm_state, step), ssm_state)
    chunked = run_ssd(_chunked_form, inputs, ssm_state, step)
    for actual, expected in zip(chunked, decode, strict=True):
        assert relative_error(actual, expected) < 1e-6


def test_a_prompt_split_over_two_steps_equals_one_step(rng):
    """13 + 17 tokens: the second step's first tokens see the first's through the conv state,
    and its SSD chunks are aligned to token 13 instead of 16."""
    slot = 4
    layer, inputs = random_conv_layer(rng), random_ssd_inputs(rng)
    x_TC = rng.standard_normal((NUM_TOKENS, CONV_CHANNELS), np.float32)
    conv_state = rng.standard_normal((NUM_SLOTS, KERNEL_WIDTH - 1, CONV_CHANNELS), np.float32)
    ssm_state = rng.standard_normal((NUM_SLOTS, NUM_HEADS, HEAD_DIM, STATE_DIM), np.float32)
    whole = make_step([(0, 30)], [slot])
    y_conv, conv_whole = run_conv(x_TC, layer, conv_state, whole)
    y_ssd, ssm_whole = run_ssd(_ssd, inputs, ssm_state, whole)
    parts_conv, parts_ssd = [], []
    for first, num_new in ((0, 13), (13, 17)):
        step = make_step([(first, num_new)], [slot])
        y, conv_state = run_conv(np.roll(x_TC, -first, axis=0), layer, conv_state, step)
        parts_conv.append(y[:num_new])
        y, ssm_state = run_ssd(_ssd, shift_tokens(inputs, first), ssm_state, step)
        parts_ssd.append(y[:num_new])
    assert relative_error(np.concatenate(parts_conv), y_conv[:30]) < 1e-6
    np.testing.assert_array_equal(conv_state[slot], conv_whole[slot])
    assert relative_error(np.concatenate(parts_ssd), y_ssd[:30]) < 1e-5
    assert relative_error(ssm_state[slot], ssm_whole[slot]) < 1e-5


def shift_tokens(inputs: SsdInputs, first: int) -> SsdInputs:
    """The inputs with token `first` moved to the front of the step."""
    per_token = ("x_THP", "dt_TH", "B_TGN", "C_TGN")
    return inputs._replace(**{name: np.roll(getattr(inputs, name), -first, axis=0) for name in per_token})


@pytest.mark.parametrize("group_size", [8, 32])
def test_rms_norm_gated_matches_transformers(group_size):
    gen = torch.Generator().manual_seed(0)
    x, z = (torch.randn(6, 32, generator=gen) for _ in range(2))
    norm = Mamba2RMSNormGated(32, group_size=group_size, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32, generator=gen))
        expected = norm(x, gate=z).numpy()
    args = (jnp.asarray(x.numpy()), jnp.asarray(z.numpy()), jnp.asarray(norm.weight.detach().numpy()))
    actual = np.asarray(rms_norm_gated(*args, group_size=group_size, eps=1e-6))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_rejects_an_unknown_activation(step):
    x_TC = jnp.zeros((NUM_TOKENS, CONV_CHANNELS))
    conv_state = jnp.zeros((NUM_SLOTS, KERNEL_WIDTH - 1, CONV_CHANNELS))
    with pytest.raises(ValueError, match="activation must be one of"):
        causal_conv1d(x_TC, jnp.zeros((KERNEL_WIDTH, CONV_CHANNELS)), None, conv_state, step.md, activation="gelu")
