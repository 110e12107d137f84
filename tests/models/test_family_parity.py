"""Every dense family against transformers: tiny random checkpoints saved by `transformers`,
read back by vjx's real loader, float32 logits of every position, on one device and split
over 2 and 4 (fake CPU) devices.

Each prompt runs as one request through the reference backend with a shuffled,
non-contiguous block table, padded to one shape, so one compile per family and layout serves
every prompt, chunk and decode step. Greedy decoding feeds each sampled token back through
the KV cache (no re-prefill), the way the engine runs a request.
"""

import jax
import numpy as np
import pytest

from tests.helpers.families import FAMILIES, MIN_PROMPT_LEN, VOCAB, Family
from tests.helpers.model_steps import prefill, random_blocks
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.config import ParallelConfig
from vjx.models.loader import get_model
from vjx.sharding.mesh import make_mesh

ATOL = 1e-4
CHUNKED_ATOL = {"bamba": 2e-5, "mamba2": 2e-5}
"""The SSD scan groups a prompt's tokens in chunks from each step's first token, so a split
regroups every chunk after it: the same sums in float32, in another order."""
TP_ATOL = 1e-4  # float32 sums split over devices round differently
LONG_PROMPT = 300
NUM_GREEDY = 32


def _token_ids(num_tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(2, VOCAB, num_tokens)


def _short_len(name: str) -> int:
    return MIN_PROMPT_LEN.get(name, 11)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> Family:
    return Family(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("length", ["short", "long"])
def test_logits_match_transformers(family, length):
    num_tokens = _short_len(family.name) if length == "short" else LONG_PROMPT
    token_ids = _token_ids(num_tokens, seed=num_tokens)
    expected = family.hf_logits(token_ids)
    assert np.abs(expected).max() > 1.0  # not a comparison of near-zero logits
    np.testing.assert_allclose(family.logits(token_ids, seed=num_tokens), expected, atol=ATOL, rtol=0)


def test_chunked_prefill_equals_unchunked(family):
    token_ids = _token_ids(LONG_PROMPT, seed=3)
    blocks = random_blocks(3)
    whole = family.logits(token_ids, seed=3)
    kv_caches, chunks, start = family.caches(), [], 0
    for end in (37, 160, LONG_PROMPT):
        logits, kv_caches = prefill(family.model, token_ids[start:end], start, blocks, kv_caches)
        chunks.append(logits)
        start = end
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=CHUNKED_ATOL.get(family.name, 1e-5), rtol=0)


@pytest.mark.parametrize("tensor_parallel_size", [2, 4])
def test_tensor_parallel_equals_one_device(family, tensor_parallel_size):
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=tensor_parallel_size))
    sharded = get_model(family.model_config, ShardedBackend(ReferenceBackend()), mesh=mesh)
    token_ids = _token_ids(LONG_PROMPT, seed=4)
    with jax.set_mesh(mesh):
        logits, _ = prefill(sharded, token_ids, 0, random_blocks(4), family.caches(tensor_parallel_size, mesh))
    expected = family.logits(token_ids, seed=4)
    np.testing.assert_allclose(logits, expected, atol=TP_ATOL, rtol=0)
    assert (logits.argmax(-1) == expected.argmax(-1)).all()


def _vjx_greedy(family: Family, prompt: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    blocks = random_blocks(5)
    logits, kv_caches = prefill(family.model, prompt, 0, blocks, family.caches())
    tokens, rows = [], [logits[-1]]
    for _ in range(NUM_GREEDY):
        tokens.append(int(rows[-1].argmax()))
        logits, kv_caches = prefill(family.model, [tokens[-1]], len(prompt) + len(tokens) - 1, blocks, kv_caches)
        rows.append(logits[-1])
    return tokens, rows[:-1]


def _hf_greedy(family: Family, prompt: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    ids, tokens, rows = list(prompt), [], []
    for _ in range(NUM_GREEDY):
        rows.append(family.hf_logits(ids)[-1])
        tokens.append(int(rows[-1].argmax()))
        ids.append(tokens[-1])
    return tokens, rows


def assert_greedy_match(ours, our_rows, theirs, their_rows, max_gap: float = 1e-3) -> None:
    """Identical tokens, or at the first difference each side's token is in the other's
    top 2 and the two tokens' logits differ by less than `max_gap` on both sides."""
    if ours == theirs:
        return
    i = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
    a, b = ours[i], theirs[i]
    for rows in (our_rows, their_rows):
        top2 = set(np.argsort(rows[i])[-2:].tolist())
        assert {a, b} == top2, (i, ours, theirs)
        assert abs(rows[i][a] - rows[i][b]) < max_gap, (i, rows[i][a], rows[i][b])


@pytest.mark.parametrize("length", ["short", "long"])
def test_greedy_tokens_match_transformers(family, length):
    num_tokens = _short_len(family.name) if length == "short" else LONG_PROMPT
    prompt = _token_ids(num_tokens, seed=6)
    ours, our_rows = _vjx_greedy(family, prompt)
    theirs, their_rows = _hf_greedy(family, prompt)
    assert_greedy_match(ours, our_rows, theirs, their_rows)
    assert len(set(ours)) > 2  # not one repeated token: that would prove little
