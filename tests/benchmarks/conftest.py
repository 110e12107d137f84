"""A tiny random Llama directory (config.json and the test tokenizer, no weights) for the
benchmark smoke tests: every engine loads it with `load_format=dummy` (see
tests/helpers/benchmark_model.py)."""

import json

import pytest

from tests.helpers.benchmark_model import TINY_CONFIG
from tests.helpers.tokenizer import make_tokenizer


@pytest.fixture(scope="package")
def tiny_model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(TINY_CONFIG))
    make_tokenizer().save_pretrained(path)
    return str(path)
