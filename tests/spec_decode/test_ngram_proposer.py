"""The n-gram proposer against vLLM's rule: the longest n-gram in [min, max] that ends the
tokens and occurs earlier wins, at its earliest occurrence; the drafts are what followed it."""

import numpy as np
import pytest

from vjx.config import SpeculativeConfig
from vjx.spec_decode.ngram_proposer import NgramProposer


def _propose(tokens, low=1, high=3, k=4, max_drafts=100):
    proposer = NgramProposer(SpeculativeConfig("ngram", k, low, high))
    return proposer.propose(np.asarray(tokens, np.int32), max_drafts)


@pytest.mark.parametrize(
    ("tokens", "low", "high", "k", "drafts"),
    [
        # "1 2 3" ends the tokens and occurred at the start: what followed it.
        ([1, 2, 3, 4, 5, 6, 1, 2, 3], 1, 3, 4, [4, 5, 6, 1]),
        # The longest match wins over a shorter, later one: "2 3" (after 9) beats "3" (after 7).
        ([2, 3, 9, 3, 7, 2, 3], 1, 3, 2, [9, 3]),
        # Among equal matches, the earliest: "5" first occurred before 1.
        ([5, 1, 5, 2, 5], 1, 1, 1, [1]),
        # Fewer tokens after the match than k: as many as there are.
        ([7, 8, 7], 1, 2, 5, [8, 7]),
        # No n-gram of at least `low` tokens recurs.
        ([1, 2, 3, 4, 1, 2], 3, 3, 4, []),
        ([4], 1, 3, 4, []),
    ],
)
def test_drafts_follow_the_longest_earliest_match(tokens, low, high, k, drafts):
    assert _propose(tokens, low, high, k) == drafts


def test_max_drafts_caps_the_drafts():
    assert _propose([1, 2, 3, 4, 5, 1, 2], max_drafts=2) == [3, 4]
    assert _propose([1, 2, 3, 4, 5, 1, 2], max_drafts=0) == []
