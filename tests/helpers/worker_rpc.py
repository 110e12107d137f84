"""Module-level functions for `collective_rpc` and `apply_model` tests: plain pickle (used
when cloudpickle is missing) sends a function to the engine process by its import path."""

import os


def worker_summary(worker, label: str, *, scale: int = 1) -> tuple[str, int]:
    """The label and the worker's KV pool size (in blocks) times `scale`."""
    return label, worker.kv_cache_config.num_blocks * scale


def model_class_name(model) -> str:
    return type(model).__name__


def process_id(worker) -> int:
    """The process the worker runs in."""
    return os.getpid()
