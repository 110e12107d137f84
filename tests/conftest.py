"""Test-wide setup: a persistent XLA compilation cache and the `gpu` marker."""

import os
import pathlib

import jax
import pytest

_CACHE_DIR = pathlib.Path(os.environ.get("VJX_TEST_JAX_CACHE", pathlib.Path.home() / ".cache/vjx/jax-test"))

jax.config.update("jax_compilation_cache_dir", str(_CACHE_DIR))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip_gpu = pytest.mark.skip(reason="needs a GPU: run on the lent device with `pytest -m gpu`")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
