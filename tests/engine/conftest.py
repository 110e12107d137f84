"""Fixtures shared by the front-end tests."""

import pytest

from tests.engine.test_output_processor import make_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The 300-token byte-level BPE of test_output_processor (built in memory, no download)."""
    return make_tokenizer()
