"""Test-wide setup: eight CPU devices, a persistent XLA compilation cache and the `gpu` marker.

The parallelism tests need a mesh of several devices: on CPU, XLA fakes eight host devices
when the flag is set before JAX starts its backend (unless the caller already set it). Every
other test keeps running on the first device.
"""

import os
import pathlib

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_COUNT_FLAG}=8".strip()

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
