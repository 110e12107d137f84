"""The on-device sampler against numpy: argmax, sort-based top-k/top-p sets, seeded draws."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import install_import_hook

from vjx.sampling.metadata import SamplingMetadata

# The metadata stays unchecked: `jit(...).lower` rebuilds pytrees with placeholder leaves.
with install_import_hook("vjx.sampling.sampler", "beartype.beartype"):
    from vjx.sampling.sampler import apply_top_k_top_p, sample

V = 64
_sample = jax.jit(sample)
_apply_top_k_top_p = jax.jit(apply_top_k_top_p)


def _md(num_rows, temperature=1.0, top_k=0, top_p=1.0, seeds=0, positions=0, all_greedy=False):
    def full(value, dtype):
        return jnp.asarray(np.broadcast_to(np.asarray(value, dtype), (num_rows,)))

    return SamplingMetadata(
        temperature=full(temperature, np.float32),
        top_k=full(top_k, np.int32),
        top_p=full(top_p, np.float32),
        seeds=full(seeds, np.int32),
        positions=full(positions, np.int32),
        all_greedy=all_greedy,
    )


def _reference_kept(logits, top_k, top_p):
    """The kept set by sorting, in float64: top-k keeps logits >= the k-th largest; top-p
    keeps logits >= the one where the descending cumulative probability first reaches p."""
    x = logits.astype(np.float64)
    if 0 < top_k < len(x):
        x = np.where(x >= np.sort(x)[::-1][top_k - 1], x, -np.inf)
    if top_p < 1.0:
        desc = np.sort(x)[::-1]
        probs = np.exp(desc - desc[0])
        cum = np.cumsum(probs) / probs.sum()
        x = np.where(x >= desc[np.searchsorted(cum, top_p)], x, -np.inf)
    return np.isfinite(x)


def _mixed_logits(rng, num_rows):
    """Rows of four kinds: spread, integer ties (with -0.0 and 0.0), peaked, very negative."""
    logits = rng.normal(size=(num_rows, V)).astype(np.float32) * 3
    logits[1::4] = rng.integers(-3, 3, size=(len(logits[1::4]), V))
    logits[1::4, :4] = [-0.0, 0.0, -0.0, 0.0]
    logits[2::4, 7] = 25.0
    logits[3::4, ::3] = -1e30
    logits[3::4, 1::5] = -np.inf
    return logits


_TOP_KS = [0, 1, 3, 10, V, V + 7, 5, 2]
_TOP_PS = [1.0, 0.9, 0.5, 0.23, 0.05, 0.77, 1.0, 0.6]


def _params(num_rows):
    rows = np.arange(num_rows)
    top_k = np.array(_TOP_KS)[rows % len(_TOP_KS)]
    top_p = np.array(_TOP_PS, np.float32)[(rows // 3) % len(_TOP_PS)]
    return top_k, top_p


def test_greedy_rows_take_the_argmax_of_the_raw_logits():
    logits = np.random.default_rng(0).normal(size=(16, V)).astype(np.float32)
    temperature = np.where(np.arange(16) % 2 == 0, 0.0, 1.0)
    tokens = np.asarray(_sample(logits, _md(16, temperature, seeds=np.arange(16))))
    np.testing.assert_array_equal(tokens[::2], logits[::2].argmax(-1))
    all_greedy = _sample(logits, _md(16, 0.0, all_greedy=True))
    assert all_greedy.dtype == jnp.int32
    np.testing.assert_array_equal(all_greedy, logits.argmax(-1))


def test_all_greedy_compiles_to_argmax_alone():
    jaxpr = str(jax.make_jaxpr(sample)(jnp.zeros((4, V)), _md(4, 0.0, all_greedy=True)))
    assert "argmax" in jaxpr
    assert "random" not in jaxpr and "threefry" not in jaxpr


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_top_k_1_is_the_argmax(dtype):
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(16, V)), dtype)
    md = _md(16, temperature=0.8, top_k=1, seeds=np.arange(16), positions=3)
    expected = np.asarray(logits.astype(jnp.float32)).argmax(-1)
    np.testing.assert_array_equal(_sample(logits, md), expected)


def test_filter_keeps_exactly_the_sorted_reference_set():
    logits = _mixed_logits(np.random.default_rng(2), 48)
    top_k, top_p = _params(48)
    filtered = np.asarray(_apply_top_k_top_p(logits, top_k, top_p))
    assert not np.isnan(filtered).any()
    for row in range(48):
        expected = _reference_kept(logits[row], top_k[row], top_p[row])
        np.testing.assert_array_equal(np.isfinite(filtered[row]), expected, err_msg=f"row {row}")
        np.testing.assert_array_equal(filtered[row][expected], logits[row][expected])


def test_bf16_filter_keeps_the_sorted_reference_set():
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(16, V)), jnp.bfloat16)
    top_k, top_p = _params(16)
    filtered = np.asarray(_apply_top_k_top_p(logits, top_k, top_p))
    as_float = np.asarray(logits.astype(jnp.float32))
    for row in range(16):
        expected = _reference_kept(as_float[row], top_k[row], top_p[row])
        np.testing.assert_array_equal(np.isfinite(filtered[row]), expected, err_msg=f"row {row}")


def test_draws_lie_in_the_top_k_top_p_set():
    num_rows = 48
    logits = _mixed_logits(np.random.default_rng(4), num_rows)
    top_k, top_p = _params(num_rows)
    temperature = np.where(np.arange(num_rows) % 2 == 0, 0.7, 1.3).astype(np.float32)
    scaled = logits / temperature[:, None]
    kept = [_reference_kept(scaled[row], top_k[row], top_p[row]) for row in range(num_rows)]
    for position in range(8):
        md = _md(num_rows, temperature, top_k, top_p, seeds=np.arange(num_rows), positions=position)
        tokens = np.asarray(_sample(logits, md))
        for row, token in enumerate(tokens):
            assert kept[row][token], f"row {row} drew {token} at position {position}"


def test_seeded_row_draws_the_same_whatever_the_batch():
    rng = np.random.default_rng(5)
    row = rng.normal(size=V).astype(np.float32)
    params = dict(temperature=0.9, top_k=20, top_p=0.95, seeds=1234)
    others = dict(temperature=[0.0, 0.5, 1.0, 2.0], top_k=[0, 3, 40], top_p=[1.0, 0.5])

    def draw(num_rows, index, position):
        logits = rng.normal(size=(num_rows, V)).astype(np.float32)
        logits[index] = row
        columns = {name: rng.permutation(np.resize(v, num_rows)) for name, v in others.items()}
        columns["seeds"] = rng.integers(0, 2**31 - 1, num_rows)
        columns["positions"] = rng.integers(0, 100, num_rows)
        for name, value in dict(params, positions=position).items():
            columns[name][index] = value
        return int(_sample(logits, _md(num_rows, **columns))[index])

    for position in range(4):
        assert draw(16, 0, position) == draw(16, 11, position) == draw(8, 3, position)


def test_positions_and_seeds_change_the_draw():
    flat = np.zeros((16, V), np.float32)
    by_position = np.asarray(_sample(flat, _md(16, seeds=7, positions=np.arange(16))))
    by_seed = np.asarray(_sample(flat, _md(16, seeds=np.arange(16), positions=0)))
    assert len(set(by_position.tolist())) >= 10
    assert len(set(by_seed.tolist())) >= 10


def test_draws_follow_the_filtered_softmax():
    num_draws, temperature = 10000, 0.7
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)
    # Top-k 3 keeps 3 tokens, top-p 0.9 keeps 4; every draw has its own position.
    settings = [(3, 1.0, 42), (0, 0.9, 7)]
    top_k, top_p, seeds = (np.repeat(column, num_draws) for column in zip(*settings))
    positions = np.tile(np.arange(num_draws), len(settings))
    md = _md(len(positions), temperature, top_k, top_p, seeds, positions)
    tokens = np.asarray(_sample(np.tile(logits, (len(positions), 1)), md)).reshape(2, num_draws)
    for tokens_of_setting, (k, p, _) in zip(tokens, settings):
        kept = _reference_kept(logits / temperature, k, p)
        expected = np.where(kept, np.exp(logits / temperature), 0.0)
        frequency = np.bincount(tokens_of_setting, minlength=len(logits)) / num_draws
        np.testing.assert_allclose(frequency, expected / expected.sum(), atol=0.02)


def test_very_negative_logits_make_no_nan():
    logits = np.full((16, V), -1e30, np.float32)
    logits[0, 5] = 0.0
    logits[1, ::2] = np.finfo(np.float32).min
    logits[1, 9] = -3.0
    logits[2] = -np.inf
    logits[3, 3:6] = [-np.inf, 1.0, 1.0]
    temperature = np.resize([0.05, 1.5, 1.0, 0.3], 16)
    md = _md(16, temperature, np.resize([0, 2, 5, 1], 16), np.resize([0.5, 1.0, 0.9, 0.1], 16))
    assert not np.isnan(np.asarray(_apply_top_k_top_p(logits, md.top_k, md.top_p))).any()
    tokens = np.asarray(_sample(logits, md))
    assert tokens[0] == 5 and tokens[1] == 9 and tokens[3] in (4, 5)
    assert 0 <= tokens[2] < V
