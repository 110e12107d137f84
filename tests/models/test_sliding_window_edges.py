"""The sliding-window edge, where engines go wrong against transformers: a query at position p
sees keys p - window + 1 .. p (the window counts the query itself).

Gemma 3's tiny config (window 32; sliding layers beside a global one) at prompt lengths
window - 1, window and window + 1, the first length whose last query loses key 0; chunked
prefills that split the prompt at those positions, so the second chunk's window starts in
the cache; and decode steps that cross the edge one token at a time. A model whose window is
one token wider gives other logits at the edge, so the checks can see an off-by-one.
"""

import copy
import dataclasses

import numpy as np
import pytest

from tests.helpers.families import VOCAB, WINDOW, Family
from tests.helpers.model_steps import prefill, random_blocks
from vjx.attention.reference import ReferenceBackend
from vjx.models.loader import get_model

ATOL = 1e-4
PROMPT = np.random.default_rng(11).integers(2, VOCAB, 2 * WINDOW + 9)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Family:
    return Family("gemma3", tmp_path_factory.mktemp("gemma3"))


@pytest.mark.parametrize("num_tokens", [WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW + 1])
def test_prompt_lengths_at_the_edge_match_transformers(gemma3, num_tokens):
    token_ids = PROMPT[:num_tokens]
    np.testing.assert_allclose(gemma3.logits(token_ids, seed=num_tokens), gemma3.hf_logits(token_ids), atol=ATOL)


@pytest.mark.parametrize("split", [WINDOW - 1, WINDOW, WINDOW + 1])
def test_a_chunk_boundary_at_the_edge_matches_transformers(gemma3, split):
    blocks = random_blocks(split)
    first, kv_caches = prefill(gemma3.model, PROMPT[:split], 0, blocks, gemma3.caches())
    second, _ = prefill(gemma3.model, PROMPT[split:], split, blocks, kv_caches)
    np.testing.assert_allclose(np.concatenate([first, second]), gemma3.hf_logits(PROMPT), atol=ATOL)


def test_decode_steps_across_the_edge_match_transformers(gemma3):
    start = WINDOW - 3
    blocks = random_blocks(1)
    _, kv_caches = prefill(gemma3.model, PROMPT[:start], 0, blocks, gemma3.caches())
    expected = gemma3.hf_logits(PROMPT[: WINDOW + 3])
    for position in range(start, WINDOW + 3):
        logits, kv_caches = prefill(gemma3.model, PROMPT[position : position + 1], position, blocks, kv_caches)
        np.testing.assert_allclose(logits[0], expected[position], atol=ATOL, err_msg=f"position {position}")


def test_a_window_one_token_wider_differs_at_the_edge(gemma3):
    wider_config = copy.deepcopy(gemma3.model_config.hf_config)
    wider_config.sliding_window = WINDOW + 1
    wider = get_model(dataclasses.replace(gemma3.model_config, hf_config=wider_config), ReferenceBackend())
    token_ids = PROMPT[: WINDOW + 1]
    expected = gemma3.hf_logits(token_ids)
    logits, _ = prefill(wider, token_ids, 0, random_blocks(2), gemma3.caches())
    np.testing.assert_allclose(logits[:WINDOW], expected[:WINDOW], atol=ATOL)
    assert np.abs(logits[WINDOW] - expected[WINDOW]).max() > 1e-2
