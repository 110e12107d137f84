"""`GgufConverter`: what differs between architectures when a GGUF becomes an HF directory."""

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np
from tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class GgufConverter:
    """What turns one llama.cpp architecture into its HF model class.

    Every function takes the file's metadata (`vjx.models.gguf.metadata.read_metadata`).
    """

    architecture: str
    """`general.architecture`, e.g. "llama"."""
    layer_tensor_names: Mapping[str, str]
    """`blk.N.<key>.weight` -> `model.layers.N.<value>.weight`."""
    model_tensor_names: Mapping[str, str]
    """`<key>.weight` -> `<value>.weight` for tensors outside the layers."""
    fix_weight: Callable[[str, np.ndarray, dict], np.ndarray]
    """(HF name, float32 weight, metadata) -> the weight as HF's model wants it."""
    config_json: Callable[[dict, bool], dict]
    """(metadata, is_tied) -> config.json; `is_tied` when the file has no output tensor."""
    generation_config_json: Callable[[dict], dict]
    build_tokenizer: Callable[[dict], Tokenizer]
    chat_template: str | None = None
    """The chat template to write when the GGUF carries none."""
