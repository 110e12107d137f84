"""Checks shared by the GGUF import tests of each embedded model."""

import os

import numpy as np
from safetensors.numpy import load_file


def assert_weights_match(model_dir: str, reference_model) -> None:
    """Every tensor of the converted `model.safetensors` equals transformers' own GGUF
    dequantization (`reference_model`), float32, with the tied LM head stored once.

    Each tensor is compared in one pass (`np.array_equal`); only a mismatch pays for
    `assert_array_equal`'s report. transformers' LM head is its embedding itself (tied), so
    it is checked by identity, not compared a second time."""
    ours = load_file(os.path.join(model_dir, "model.safetensors"))
    reference = {name: t.numpy() for name, t in reference_model.state_dict().items()}
    assert sorted(reference) == sorted([*ours, "lm_head.weight"])
    assert np.shares_memory(reference.pop("lm_head.weight"), reference["model.embed_tokens.weight"])
    for name, weight in reference.items():
        assert ours[name].dtype == np.float32, name
        assert ours[name].shape == weight.shape, name
        if not np.array_equal(ours[name], weight, equal_nan=True):
            np.testing.assert_array_equal(ours[name], weight, err_msg=name)
