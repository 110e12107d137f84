"""ExecutableCache: compiled step programs kept on disk, so a warm start skips tracing.

JAX's persistent compilation cache skips only XLA's compile: before it can look a program up
it must trace the model and lower it to HLO, which for a many-layer model costs about as
much as reading the executable back. This cache stores each compiled step whole
(`jax.experimental.serialize_executable`) under a key made of everything that decides the
program without tracing it: the engine's source, the JAX version and backend, the mesh, the
model's hyperparameters and dtype, the attention backend, the step layout and the shape,
dtype and sharding of every input. A hit is deserialized and loaded; a miss, or any error
while reading (an entry from another build, a truncated file), falls back to compiling.

Entries live in `vjx-executables/<source digest>/` inside JAX's persistent cache directory,
so whoever moves that directory (the tests, a user) moves this one with it. Any edit of the
engine's source starts a new folder; only the few most recently written folders are kept.
Like JAX's own cache, an entry is trusted code: the directory must be the user's own.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import os
import pathlib
import pickle
import shutil
import tempfile
import threading
from collections.abc import Callable

import jax
from jax.sharding import Mesh

from vjx import process_setup
from vjx.config import VjxConfig
from vjx.worker.compile_watch import CompileWatch

logger = logging.getLogger(__name__)

_SUBDIRECTORY = "vjx-executables"
_NUM_SOURCE_VERSIONS_KEPT = 3
_SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[1]
# Config keys that name the checkpoint's files or writer, not the model: they must not
# split the cache.
_PATH_KEYS = ("_name_or_path", "transformers_version")


@functools.cache
def source_digest() -> str:
    """sha256 over every file of the `vjx` package (path and bytes), computed once."""
    digest = hashlib.sha256()
    for path in sorted(_SOURCE_ROOT.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(_SOURCE_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_directory() -> pathlib.Path | None:
    """`vjx-executables/` in JAX's persistent cache directory; None when that cache is off."""
    root = jax.config.jax_compilation_cache_dir
    return pathlib.Path(root) / _SUBDIRECTORY if root else None


def _platform_facts(mesh: Mesh) -> dict:
    """The software and hardware an executable is bound to."""
    import jaxlib

    device = mesh.devices.flat[0]
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": device.platform,
        "platform_version": device.client.platform_version,
        "device_kind": device.device_kind,
        "mesh": [list(mesh.axis_names), list(mesh.devices.shape), [d.id for d in mesh.devices.flat]],
        "x64": bool(jax.config.jax_enable_x64),
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
        "xla_flags": process_setup.xla_flags(),
    }


def _model_facts(config: VjxConfig) -> dict:
    """What the traced program reads from the config besides input shapes."""
    hf = {k: v for k, v in config.model_config.hf_config.to_dict().items() if k not in _PATH_KEYS}
    return {
        "hf_config": hf,
        "dtype": config.model_config.dtype,
        "attention_backend": config.attention_backend,
        "parallel": dataclasses.asdict(config.parallel_config),
    }


def _signature(args) -> list:
    """Shape, dtype and sharding of every input leaf, and the inputs' tree structure."""
    leaves, treedef = jax.tree.flatten(args)
    return [str(treedef)] + [[list(x.shape), str(x.dtype), repr(x.sharding)] for x in leaves]


class ExecutableCache:
    """Compiled steps on disk, one file per key; never raises on a bad entry."""

    def __init__(self, directory: pathlib.Path, config: VjxConfig, mesh: Mesh):
        """`directory` holds one folder per source version; this engine's is `self.directory`."""
        self.root = directory
        self.directory = directory / source_digest()[:16]
        self._devices = list(mesh.devices.flat)
        self._base = {"source": source_digest(), **_platform_facts(mesh), **_model_facts(config)}
        self.num_hits = 0
        self.num_misses = 0
        self._count_lock = threading.Lock()

    @classmethod
    def in_compilation_cache_dir(cls, config: VjxConfig, mesh: Mesh) -> "ExecutableCache | None":
        """The cache under JAX's persistent cache directory; None when that cache is off, or
        when this JAX lacks something the key reads (then every start compiles, as before)."""
        directory = cache_directory()
        if directory is None:
            return None
        try:
            return cls(directory, config, mesh)
        except Exception as error:  # the cache is an optimization, never a failure
            logger.warning("executable cache off (%s: %s)", type(error).__name__, error)
            return None

    def key(self, name: str, args) -> str:
        """Hex digest naming the program `name` (e.g. the step layout's repr) over `args`."""
        facts = {**self._base, "program": name, "signature": _signature(args)}
        return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()

    def get_or_compile(self, name: str, args, compile_fn: Callable[[], jax.stages.Compiled]):
        """The stored executable for (`name`, `args`), else `compile_fn()` (then stored)."""
        key = self.key(name, args)
        compiled = self._load(key)
        with self._count_lock:
            self.num_hits += compiled is not None
            self.num_misses += compiled is None
        if compiled is not None:
            return compiled
        with CompileWatch(is_strict=False) as watch:
            compiled = compile_fn()
        # An executable that JAX's persistent cache deserialized does not survive a second
        # round trip on XLA:CPU (its kernels go missing): only fresh compiles are kept.
        if watch.num_compiles > watch.num_cache_hits:
            self._store(key, compiled)
        return compiled

    def _path(self, key: str) -> pathlib.Path:
        return self.directory / f"{key}.bin"

    def _load(self, key: str):
        from jax.experimental import serialize_executable

        path = self._path(key)
        if not path.exists():
            return None
        try:
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            return serialize_executable.deserialize_and_load(
                payload, in_tree, out_tree, execution_devices=self._devices
            )
        except Exception as error:  # any bad entry means: compile instead
            logger.warning(
                "ignoring the cached executable %s (%s: %s); compiling instead", path, type(error).__name__, error
            )
            path.unlink(missing_ok=True)
            return None

    def _store(self, key: str, compiled) -> None:
        """Writes the entry atomically (a temporary file renamed into place)."""
        try:
            from jax.experimental import serialize_executable

            blob = pickle.dumps(serialize_executable.serialize(compiled))
            if not self.directory.exists():
                self.directory.mkdir(parents=True)
                self._drop_old_versions()
            with tempfile.NamedTemporaryFile(dir=self.directory, suffix=".tmp", delete=False) as f:
                f.write(blob)
            os.replace(f.name, self._path(key))
        except Exception as error:  # a failed store only costs the next start
            logger.warning("could not store the executable %s (%s: %s)", key, type(error).__name__, error)

    def _drop_old_versions(self) -> None:
        """Deletes the folders of all but the most recently written source versions."""
        folders = sorted((p for p in self.root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for folder in folders[:-_NUM_SOURCE_VERSIONS_KEPT]:
            shutil.rmtree(folder, ignore_errors=True)
