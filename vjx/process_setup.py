"""Process-wide state the engine depends on, owned here and nowhere else.

Four things belong to the whole process, not to one engine object:
- the environment JAX's backends read once, when they start (`XLA_PYTHON_CLIENT_PREALLOCATE`,
  `XLA_FLAGS`);
- `jax.config`: the persistent compilation cache, and which GPUs an engine process sees;
- the garbage collector's frozen generation, shared by every engine in the process;
- the global random generators of Python and NumPy, seeded from `EngineArgs.seed` at the end
  of `EngineCore`'s start-up, in the process that runs the model (`set_random_seed`), as
  vLLM's worker does.

Entry points call `setup_process()` before anything starts JAX's backends: `LLMEngine` (so
`LLM`), `AsyncLLM`, the `vjx` command and, through `setup_engine_process`, the engine
process. A program that builds `EngineCore` from `EngineArgs.create_engine_config()` itself
calls `setup_process()` first. Engine objects report their lives with `engine_starting`,
`engine_started` and `engine_stopped`, which keep the start-up heap frozen while any engine
lives.
"""

import ctypes
import ctypes.util
import gc
import os
import pathlib
import random
import threading
import weakref

import jax
import numpy as np

_LIBC_NAME = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_LIBC_NAME) if _LIBC_NAME else None
_PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
_COMPILATION_CACHE_DIR = pathlib.Path.home() / ".cache" / "vjx" / "xla"
_COMPILATION_CACHE_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


def setup_process() -> None:
    """Prepares this process for engines; idempotent, and a no-op for what the user set.

    Must run before JAX's backends start (the first platform query starts them). The engine
    sizes its KV cache from the device memory left free, and a front-end process (the server,
    a multiprocess `LLM`) must not hold memory its engine process needs, so JAX's default of
    reserving most of a GPU's memory at start is off unless the user set it.
    """
    os.environ.setdefault(_PREALLOCATE_ENV, "false")
    enable_compilation_cache()


def set_random_seed(seed: int | None, data_parallel_rank: int = 0) -> None:
    """Seeds Python's `random` and NumPy's global generator (`np.random.seed`) in this process,
    as vLLM does at worker start. Data-parallel replicas after the first mix their rank into
    the seed, so they do not sample unseeded requests alike."""
    if seed is None:
        return
    if data_parallel_rank:
        seed = int(np.random.SeedSequence((seed, data_parallel_rank)).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed)


def enable_compilation_cache() -> None:
    """Turns on JAX's persistent compilation cache in ~/.cache/vjx/xla, every program
    included, unless the user configured a cache directory; idempotent."""
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(_COMPILATION_CACHE_DIR))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def compilation_cache_options() -> dict:
    """This process's compilation cache options, for an engine process to share its cache."""
    options = {name: getattr(jax.config, name, None) for name in _COMPILATION_CACHE_OPTIONS}
    return {name: value for name, value in options.items() if value is not None}


def setup_engine_process(cache_options: dict, visible_devices: str | None) -> None:
    """The engine process's `setup_process`, before JAX starts there.

    `cache_options` (the parent's `compilation_cache_options()`) make both processes read and
    fill one cache. `visible_devices` (comma-separated GPU ids, or None for all) hides the
    other replicas' GPUs, so the process neither sees nor reserves memory on them.
    """
    unknown = sorted(set(cache_options) - set(_COMPILATION_CACHE_OPTIONS))
    if unknown:
        raise ValueError(f"cache_options must name only {_COMPILATION_CACHE_OPTIONS}, got {unknown}.")
    for name, value in cache_options.items():
        jax.config.update(name, value)
    if visible_devices is not None:
        jax.config.update("jax_cuda_visible_devices", visible_devices)
    setup_process()


def environment(name: str) -> str | None:
    """One variable of this process's environment (for a process started elsewhere, e.g. a
    Ray actor, to start with)."""
    return os.environ.get(name)


def xla_flags() -> str:
    """The XLA flags of this process (they shape every compiled program)."""
    return os.environ.get("XLA_FLAGS", "")


def release_free_heap() -> None:
    """Returns the C heap's free pages to the operating system (glibc's `malloc_trim`), so a
    process's resident memory after start-up is what it holds, not what start-up once used;
    a no-op on other C libraries."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


class HeapFreeze:
    """Keeps the start-up heap out of the garbage collector's reach while an engine lives.

    An engine's start-up heap (the model's modules, traced and compiled programs, the
    tokenizer) lives as long as the engine, yet every full collection would walk all of it
    again: millions of objects, a large fraction of a second each time (vLLM's engine core
    freezes its heap too). The frozen generation is one per process, so it is counted per
    live engine: it stays frozen while at least one lives. Every change first unfreezes and
    collects, so no garbage stays frozen: an engine holds reference cycles, and one dropped
    without `engine_stopped` (its device buffers included) is freed only by a collection,
    which never sees frozen objects. Engines are held weakly, so a dropped one stops
    counting once it is collected.
    """

    def __init__(self):
        self._live_engines: weakref.WeakSet = weakref.WeakSet()
        # Re-entrant: a collection may run finalizers that stop an engine.
        self._lock = threading.RLock()

    @property
    def num_live_engines(self) -> int:
        return len(self._live_engines)

    def collect(self) -> None:
        """Collects everything unreachable, frozen garbage included; the heap of the engines
        still alive is frozen again."""
        with self._lock:
            gc.unfreeze()
            gc.collect()
            if self._live_engines:
                gc.freeze()

    def engine_started(self, engine: object) -> None:
        """Freezes everything alive now, `engine`'s start-up heap included, and hands the
        memory start-up freed (loading, tracing, compiling) back to the operating system."""
        with self._lock:
            self._live_engines.add(engine)
            self.collect()
        release_free_heap()

    def engine_stopped(self, engine: object) -> None:
        """`engine` no longer counts (a second call is a no-op); the heap stays frozen if
        other engines live, else it is handed back to the collector."""
        with self._lock:
            if engine not in self._live_engines:
                return
            self._live_engines.discard(engine)
            self.collect()


_HEAP_FREEZE = HeapFreeze()


def engine_starting() -> None:
    """Before an engine builds anything: the compilation cache is on, and engines dropped
    since an earlier one started are freed, so the new one measures the memory really free."""
    enable_compilation_cache()
    _HEAP_FREEZE.collect()


def engine_started(engine: object) -> None:
    """`engine` has started: its start-up heap is frozen while it lives (see `HeapFreeze`)."""
    _HEAP_FREEZE.engine_started(engine)


def engine_stopped(engine: object) -> None:
    """`engine` has shut down; safe to call more than once."""
    _HEAP_FREEZE.engine_stopped(engine)
