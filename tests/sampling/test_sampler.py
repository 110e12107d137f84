"""The on-device sampler against numpy: argmax of the processed logits, sort-based
top-k/top-p sets, min-p support, seeded draws and their frequencies."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import install_import_hook

from tests.helpers.quick_compile import quick_jit
from tests.helpers.sampling_metadata import make_metadata, pad_rows, reference_penalties

# The metadata stays unchecked: `jit(...).lower` rebuilds pytrees with placeholder leaves.
with install_import_hook("vjx.sampling.sampler", "beartype.beartype"):
    from vjx.sampling.sampler import sample
with install_import_hook(["vjx.sampling.top_k_top_p", "tests.helpers.top_k_top_p"], "beartype.beartype"):
    from tests.helpers.top_k_top_p import apply_top_k_top_p
    from vjx.sampling.top_k_top_p import SubsetShape

V = 64
_sample = quick_jit(sample)
_apply_top_k_top_p = quick_jit(apply_top_k_top_p)


def _md(num_rows, temperature=1.0, top_k=0, top_p=1.0, seeds=0, positions=0, all_greedy=False, vocab_size=V):
    return make_metadata(
        num_rows,
        vocab_size,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seeds=seeds,
        sample_positions=positions,
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


def test_greedy_rows_without_processors_take_the_argmax_of_the_raw_logits():
    logits = np.random.default_rng(0).normal(size=(16, V)).astype(np.float32)
    temperature = np.where(np.arange(16) % 2 == 0, 0.0, 1.0)
    tokens = np.asarray(_sample(logits, _md(16, temperature, seeds=np.arange(16))))
    np.testing.assert_array_equal(tokens[::2], logits[::2].argmax(-1))
    all_greedy = _sample(logits, _md(16, 0.0, all_greedy=True))
    assert all_greedy.dtype == jnp.int32
    np.testing.assert_array_equal(all_greedy, logits.argmax(-1))


def test_all_greedy_compiles_without_the_draw():
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
    md = _md(len(positions), temperature, top_k, top_p, seeds, positions, vocab_size=len(logits))
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


def test_greedy_takes_the_argmax_of_the_processed_logits():
    rng = np.random.default_rng(6)
    num_rows = 16
    logits = rng.normal(size=(num_rows, V)).astype(np.float32)
    top = logits.argmax(-1)
    # Rows 0-7: the top token was said before, penalized below the second; rows 8-15: a bias
    # lifts token 0 over the top.
    histories = [([int(t)], [int(t)]) for t in top[:8]] + [([1], [])] * 8
    bias = np.zeros((num_rows, V), np.float32)
    bias[8:, 0] = 10.0
    md = make_metadata(
        num_rows,
        V,
        temperature=np.resize([0.0, 0.9], num_rows),
        seeds=np.arange(num_rows),
        token_ids=pad_rows([p + o for p, o in histories], 0),
        num_tokens=[len(p + o) for p, o in histories],
        num_prompt_tokens=[len(p) for p, _ in histories],
        repetition_penalty=[4.0] * 8 + [1.0] * 8,
        presence_penalty=[1.0] * 8 + [0.0] * 8,
        logit_bias=bias,
        has_logit_bias=[False] * 8 + [True] * 8,
    )
    penalized = [reference_penalties(logits[r], p, o, 1.0, 0.0, 4.0) for r, (p, o) in enumerate(histories[:8])]
    expected = np.concatenate([np.stack(penalized), logits[8:] + bias[8:]]).argmax(-1)
    assert (expected != top).all()
    tokens = np.asarray(_sample(logits, md))
    np.testing.assert_array_equal(tokens[::2], expected[::2])
    greedy_md = make_metadata(num_rows, V, temperature=0.0, all_greedy=True)
    np.testing.assert_array_equal(_sample(logits, greedy_md), top)


def test_greedy_rows_beside_padding_rows_take_the_argmax():
    """Padding rows (no tokens) may hold any temperature: a batch whose real rows are greedy
    still gives them the argmax (on the CPU without drawing)."""
    logits = np.random.default_rng(3).normal(size=(8, V)).astype(np.float32)
    md = make_metadata(8, V, temperature=[0.0] * 4 + [1.0] * 4, num_tokens=[5] * 4 + [0] * 4)
    np.testing.assert_array_equal(np.asarray(_sample(logits, md))[:4], logits[:4].argmax(-1))


def test_every_row_greedy_at_run_time_gives_the_static_answer():
    logits = np.random.default_rng(7).normal(size=(8, V)).astype(np.float32)
    dynamic = _sample(logits, _md(8, temperature=0.0, top_k=3, top_p=0.5))
    np.testing.assert_array_equal(dynamic, _sample(logits, _md(8, temperature=0.0, all_greedy=True)))


@pytest.mark.parametrize(("temperature", "min_p"), [(1.0, 0.2), (0.5, 0.2), (2.0, 0.6)])
def test_min_p_draws_exactly_the_tokens_above_min_p_times_the_max(temperature, min_p):
    probs = np.full(V, 0.001)
    probs[:6] = [0.4, 0.2, 0.12, 0.1, 0.079, 0.05]
    logits = np.log(probs).astype(np.float32)
    scaled = logits.astype(np.float64) / temperature
    expected = set(np.flatnonzero(np.exp(scaled - scaled.max()) >= min_p).tolist())
    num_draws = 2000
    md = _md(num_draws, temperature, seeds=11, positions=np.arange(num_draws))
    md = dataclasses.replace(md, min_p=jnp.full(num_draws, min_p, jnp.float32))
    tokens = np.asarray(_sample(np.tile(logits, (num_draws, 1)), md))
    assert set(tokens.tolist()) == expected


def test_temperature_scales_the_softmax_chi_square():
    logits = np.array([1.0, 0.5, 0.2, 0.0, -0.3, -0.6, -1.0, -1.5], np.float32)
    num_draws = 20000
    critical = 24.32  # chi-square, 7 degrees of freedom, p = 0.001
    for seed, temperature in enumerate([0.5, 1.0, 2.0]):
        md = _md(num_draws, temperature, seeds=seed, positions=np.arange(num_draws), vocab_size=len(logits))
        tokens = np.asarray(_sample(np.tile(logits, (num_draws, 1)), md))
        expected = np.exp(logits / temperature)
        expected = expected / expected.sum() * num_draws
        observed = np.bincount(tokens, minlength=len(logits))
        chi_square = ((observed - expected) ** 2 / expected).sum()
        assert chi_square < critical, f"temperature {temperature}: chi-square {chi_square:.1f}"


def test_rows_masked_to_one_token_draw_it_without_nan():
    num_rows = 8
    logits = np.random.default_rng(8).normal(size=(num_rows, V)).astype(np.float32) * 5
    allowed = np.arange(num_rows) * 3 + 1
    bias = np.full((num_rows, V), -np.inf, np.float32)
    bias[np.arange(num_rows), allowed] = 0.0
    md = make_metadata(
        num_rows,
        V,
        temperature=np.resize([0.0, 0.7, 1.5, 0.05], num_rows),
        top_k=np.resize([0, 1, 3], num_rows),
        top_p=np.resize([1.0, 0.3], num_rows),
        min_p=np.resize([0.0, 0.5, 1.0], num_rows),
        seeds=np.arange(num_rows),
        token_ids=allowed[:, None],
        num_prompt_tokens=0,
        num_tokens=1,
        repetition_penalty=1.5,
        frequency_penalty=2.0,
        presence_penalty=-2.0,
        logit_bias=bias,
        has_logit_bias=True,
    )
    np.testing.assert_array_equal(_sample(logits, md), allowed)


def _peaked_logits(rng, num_rows, vocab_size):
    """LM-like rows: a few dozen likely tokens over a long tail, with ties (integer rows)."""
    logits = rng.normal(size=(num_rows, vocab_size)).astype(np.float32) * 2
    head = rng.integers(0, vocab_size, size=(num_rows, 24))
    np.put_along_axis(logits, head, rng.normal(size=(num_rows, 24)).astype(np.float32) * 2 + 9, axis=1)
    logits[1::5] = np.round(logits[1::5])
    return logits


def test_subset_search_keeps_exactly_the_sorted_reference_set():
    import functools

    from vjx.sampling import top_k_top_p

    num_rows, vocab_size, subset = 60, 256, SubsetShape(chunk_size=8, num_chunks=4)
    logits = _peaked_logits(np.random.default_rng(9), num_rows, vocab_size)
    top_k = np.resize([1, 3, 4, 10, 50, 0, 2], num_rows)
    top_p = np.resize(np.array([1.0, 0.9, 0.5, 0.05, 0.99], np.float32), num_rows)
    on_subset = quick_jit(functools.partial(apply_top_k_top_p, subset=subset))
    filtered = np.asarray(on_subset(logits, top_k, top_p))
    for row in range(num_rows):
        expected = _reference_kept(logits[row], top_k[row], top_p[row])
        np.testing.assert_array_equal(np.isfinite(filtered[row]), expected, err_msg=f"row {row}")
    # Both paths ran: some rows are exact on their subset, the others fell back.
    ones = jnp.ones(num_rows, jnp.float32)
    params = top_k_top_p.FilterParams(ones, 0 * ones, jnp.asarray(top_k), jnp.asarray(top_p))
    _, is_exact = top_k_top_p._subset_thresholds(jnp.asarray(logits), jnp.asarray(logits), params, subset)
    assert 0 < int(np.sum(is_exact)) < num_rows


def test_draws_at_a_real_vocab_size_lie_in_the_reference_set():
    num_rows, vocab_size = 8, 65536
    assert SubsetShape().fits(vocab_size)
    logits = _peaked_logits(np.random.default_rng(10), num_rows, vocab_size)
    top_k = np.resize([50, 0, 20, 1], num_rows)
    top_p = np.resize(np.array([0.9, 0.8, 1.0, 0.5], np.float32), num_rows)
    scaled = logits / np.float32(0.8)
    kept = [_reference_kept(scaled[row], top_k[row], top_p[row]) for row in range(num_rows)]
    for position in range(4):
        md = _md(num_rows, 0.8, top_k, top_p, seeds=np.arange(num_rows), positions=position, vocab_size=vocab_size)
        for row, token in enumerate(np.asarray(_sample(logits, md))):
            assert kept[row][token], f"row {row} drew {token} at position {position}"


def test_static_flags_leave_out_what_the_batch_does_not_use():
    num_rows = 16
    logits = np.random.default_rng(11).normal(size=(num_rows, V)).astype(np.float32) * 3
    md = _md(num_rows, temperature=np.resize([0.0, 0.7, 1.0, 1.6], num_rows), seeds=np.arange(num_rows), positions=5)
    plain = dataclasses.replace(md, may_filter=False, may_process=False)
    jaxpr = str(jax.make_jaxpr(sample)(jnp.asarray(logits), plain))
    assert "cond" not in jaxpr and "while" not in jaxpr
    np.testing.assert_array_equal(_sample(logits, plain), _sample(logits, md))
    greedy = dataclasses.replace(plain, temperature=jnp.zeros(num_rows), all_greedy=True)
    assert "cond" not in str(jax.make_jaxpr(sample)(jnp.asarray(logits), greedy))
    np.testing.assert_array_equal(_sample(logits, greedy), logits.argmax(-1))
