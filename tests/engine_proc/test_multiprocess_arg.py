"""The `multiprocess` engine argument: off on CPU, and a clear error without the packages."""

import importlib.util

import pytest

from vjx.engine_args import EngineArgs


def test_cpu_default_is_in_process():
    assert EngineArgs(max_model_len=64).create_engine_config().multiprocess is False
    assert EngineArgs(max_model_len=64, multiprocess=True).create_engine_config().multiprocess is True


def test_multiprocess_without_pyzmq_is_refused(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "zmq" else real_find_spec(name, *a)
    )
    with pytest.raises(ValueError, match="multiprocess=True needs pyzmq and msgspec"):
        EngineArgs(max_model_len=64, multiprocess=True).create_engine_config()
    assert EngineArgs(max_model_len=64).create_engine_config().multiprocess is False
