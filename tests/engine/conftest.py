"""Fixtures shared by the front-end tests."""

import pytest

from tests.helpers.tokenizer import make_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The 300-token byte-level BPE of tests/helpers/tokenizer.py (built in memory, no download)."""
    return make_tokenizer()
