"""GGUF import: one llama.cpp GGUF file -> a Hugging Face model directory.

The directory holds what the safetensors loader and `transformers.AutoTokenizer` read:

    model.safetensors        every tensor dequantized to float32, under HF names
    config.json              the HF architecture, from the `<arch>.*` metadata
    generation_config.json   bos/eos/pad ids (and what else the architecture adds)
    tokenizer.json           the vocabulary from the `tokenizer.ggml.*` metadata
    tokenizer_config.json    special tokens, chat template, add_bos/add_eos, max length

Reading, dequantizing and writing are shared; what differs per architecture (tensor names,
the rewrites llama.cpp's convert script applied, the config, the tokenizer) is one
`GgufConverter` per architecture (`vjx.models.gguf.llama`, `vjx.models.gguf.gemma3`). Only
numpy, `gguf` and `tokenizers` are used, so importing a GGUF needs no torch.
"""

import json
import logging
import os

import gguf
import numpy as np
from safetensors.numpy import save_file

from vjx.models.gguf.converter import GgufConverter
from vjx.models.gguf.gemma3 import GEMMA3
from vjx.models.gguf.llama import LLAMA
from vjx.models.gguf.metadata import read_metadata
from vjx.models.gguf.special_tokens import tokenizer_config_json

logger = logging.getLogger(__name__)

_CONVERTERS = {converter.architecture: converter for converter in (LLAMA, GEMMA3)}


def convert_gguf_to_hf(gguf_path: str, out_dir: str) -> None:
    """Writes the HF model directory for the GGUF at `gguf_path` into `out_dir`."""
    if not os.path.isfile(gguf_path):
        raise ValueError(f"gguf_path: {gguf_path!r} is not a file")
    reader = gguf.GGUFReader(gguf_path)
    metadata = read_metadata(reader)
    converter = _get_converter(metadata.get("general.architecture"))
    os.makedirs(out_dir, exist_ok=True)
    tensors = read_tensors(reader, converter, metadata)
    logger.info("writing %d tensors of %s to %s", len(tensors), gguf_path, out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    is_tied = "lm_head.weight" not in tensors
    _write_json(out_dir, "config.json", converter.config_json(metadata, is_tied))
    _write_json(out_dir, "generation_config.json", converter.generation_config_json(metadata))
    converter.build_tokenizer(metadata).save(os.path.join(out_dir, "tokenizer.json"))
    _write_json(out_dir, "tokenizer_config.json", tokenizer_config_json(metadata, converter.chat_template))


def read_tensors(reader: gguf.GGUFReader, converter: GgufConverter, metadata: dict) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized to float32, under its HF name and in HF's form."""
    tensors = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, converter)
        # GGUF lists dimensions innermost first; numpy (and HF) outermost first.
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        weight = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        weight = converter.fix_weight(name, weight.reshape(shape), metadata)
        tensors[name] = np.ascontiguousarray(weight)
    return tensors


def hf_tensor_name(gguf_name: str, converter: GgufConverter) -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if suffix == "weight" and len(parts) == 3 and parts[0] == "blk" and parts[2] in converter.layer_tensor_names:
        return f"model.layers.{int(parts[1])}.{converter.layer_tensor_names[parts[2]]}.weight"
    if suffix == "weight" and stem in converter.model_tensor_names:
        return f"{converter.model_tensor_names[stem]}.weight"
    raise ValueError(f"gguf_path: tensor {gguf_name!r} has no Hugging Face {converter.architecture} counterpart")


def _get_converter(architecture: str | None) -> GgufConverter:
    if architecture not in _CONVERTERS:
        raise ValueError(f"gguf_path: architecture {architecture!r} is not supported; supported: {sorted(_CONVERTERS)}")
    return _CONVERTERS[architecture]


def _write_json(out_dir: str, name: str, content: dict) -> None:
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, ensure_ascii=False)
        f.write("\n")
