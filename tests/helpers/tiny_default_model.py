"""A tiny random stand-in for the default model, for engine tests whose property is about the
engine (scheduling, validation, completion), not about the model's numbers.

It is SmolLM2-135M-Instruct's own directory with the weights swapped: the same tokenizer,
generation config, vocabulary (49152), EOS and BOS ids and architecture, so prompts tokenize
to the same lengths and the same token ids are valid; only the layers shrink (2 of hidden 64
instead of 30 of hidden 576). Its step compiles in a fraction of the default model's time and
decodes many times faster, so a test that must run hundreds of decode steps stays cheap.
"""

import json
import pathlib
import shutil

import torch
import transformers

from tests.helpers.tiny_llama import randomize_
from vjx.models.default_model import get_default_model_path

_COPIED_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json")
_SHRUNK = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
TINY_DEFAULT_ARGS = dict(
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=32,
    num_gpu_blocks_override=400,
)
"""The large engine's context, batch and pool (tests/helpers/large_engine.py) with a 32-token
budget: two token buckets, two step variants to compile (GENERAL alone on the CPU). Every module that
runs the stand-in with these arguments shares its compiled steps through the persistent cache."""


def save_tiny_default_model(path: pathlib.Path, seed: int = 0, **overrides) -> str:
    """Writes the stand-in to `path` and returns it as a string (the `model` argument);
    `overrides` change its config further (e.g. a draft model of one layer)."""
    default = pathlib.Path(get_default_model_path())
    fields = json.loads((default / "config.json").read_text(encoding="utf-8"))
    config = transformers.LlamaConfig(**{**fields, **_SHRUNK, **overrides})
    torch.manual_seed(seed)
    hf_model = transformers.LlamaForCausalLM(config).eval()
    randomize_(hf_model, seed)
    hf_model.save_pretrained(path)
    for name in _COPIED_FILES:
        shutil.copy(default / name, pathlib.Path(path) / name)
    return str(path)
