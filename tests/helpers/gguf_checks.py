"""Checks shared by the GGUF import tests of each embedded model."""

import os

import numpy as np
from safetensors.numpy import load_file


def assert_weights_match(model_dir: str, reference_model) -> None:
    """Every tensor of the converted `model.safetensors` equals transformers' own GGUF
    dequantization (`reference_model`), float32, with the tied LM head stored once."""
    ours = load_file(os.path.join(model_dir, "model.safetensors"))
    reference = {name: t.numpy() for name, t in reference_model.state_dict().items()}
    assert sorted(reference) == sorted([*ours, "lm_head.weight"])
    ours["lm_head.weight"] = ours["model.embed_tokens.weight"]
    for name, weight in reference.items():
        assert ours[name].dtype == np.float32, name
        assert ours[name].shape == weight.shape, name
        np.testing.assert_array_equal(ours[name], weight, err_msg=name)
