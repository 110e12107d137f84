"""Process-wide setup: JAX's preallocation off and the compilation cache on unless the user
set them, the engine process's options, and the entry points calling it before JAX starts."""

import os

import jax
import pytest

from tests.helpers.fake_engine_core import make_llm
from vjx import process_setup
from vjx.engine_args import EngineArgs

_CACHE_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def cache_options():
    """Restores the test-wide compilation cache options after a test changes them."""
    saved = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


def test_gpu_memory_is_not_preallocated_unless_the_user_says(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    process_setup.setup_process()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    process_setup.setup_process()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_compilation_cache_defaults_on_and_keeps_the_users(cache_options, tmp_path):
    jax.config.update("jax_compilation_cache_dir", None)
    process_setup.enable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir.endswith(os.path.join(".cache", "vjx", "xla"))
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)
    process_setup.enable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.0


def test_engine_process_takes_the_parents_cache_options(cache_options, tmp_path):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    options = process_setup.compilation_cache_options()
    assert options["jax_compilation_cache_dir"] == str(tmp_path)
    assert set(options) <= set(_CACHE_OPTIONS)
    jax.config.update("jax_compilation_cache_dir", None)
    process_setup.setup_engine_process(options, visible_devices=None)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)


def test_engine_process_refuses_other_options():
    with pytest.raises(ValueError, match="cache_options must name only"):
        process_setup.setup_engine_process({"jax_enable_x64": True}, visible_devices=None)


def test_xla_flags_are_the_process_flags():
    assert process_setup.xla_flags() == os.environ.get("XLA_FLAGS", "")


def test_llm_sets_up_the_process_before_building_its_config(tmp_path, monkeypatch):
    """The config's platform queries start JAX's backends: preallocation is off by then."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    seen = []
    create = EngineArgs.create_engine_config

    def record(self):
        seen.append(os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"))
        return create(self)

    monkeypatch.setattr(EngineArgs, "create_engine_config", record)
    make_llm(tmp_path, monkeypatch)
    assert seen == ["false"]
