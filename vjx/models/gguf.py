"""GGUF import: one llama.cpp GGUF file -> a Hugging Face Llama model directory.

The directory holds what the safetensors loader and `transformers.AutoTokenizer` read:

    model.safetensors        every tensor dequantized to float32, under HF Llama names
    config.json              LlamaForCausalLM, from the `llama.*` metadata
    generation_config.json   bos/eos/pad ids
    tokenizer.json           byte-level BPE from the `tokenizer.ggml.*` metadata
    tokenizer_config.json    special tokens, chat template, add_bos/add_eos, max length

Only numpy, `gguf` (reading and dequantizing) and `tokenizers` are used, so importing a GGUF
needs no torch. llama.cpp's convert script permutes the rows of q_proj and k_proj so that
each head's rotary pairs are interleaved (GPT-J style RoPE); this module reverses that, so
the weights fit HF's rotate_half layout, the one HF checkpoints (and vjx's loader) use.
"""

import dataclasses
import json
import logging
import os

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

logger = logging.getLogger(__name__)

_LAYER_TENSOR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_MODEL_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# HF's special token name -> llama.cpp's, as in `tokenizer.ggml.<name>_token_id`.
_SPECIAL_TOKENS = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}
# llama.cpp's token types (`llama_token_type`): which entries are added tokens.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# The GPT-2 split (`'s|'t|...| ?\p{L}+| ?\p{N}+|...`) is ByteLevel's built-in regex.
_ISOLATE_DIGITS = r"\p{N}"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the regexes llama.cpp splits with, applied in order; None stands
# for the GPT-2 split.
_PRE_TOKENIZER_SPLITS = {
    "gpt2": (None,),
    "mpt": (None,),
    "olmo": (None,),
    "smollm": (_ISOLATE_DIGITS, None),
    "starcoder": (_ISOLATE_DIGITS, None),
    "refact": (_ISOLATE_DIGITS, None),
    "codeshell": (_ISOLATE_DIGITS, None),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
}


@dataclasses.dataclass(frozen=True)
class _LlamaDims:
    """The model shape a GGUF states, under HF's config names."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float


def convert_gguf_to_hf(gguf_path: str, out_dir: str) -> None:
    """Writes the HF model directory for the Llama GGUF at `gguf_path` into `out_dir`."""
    if not os.path.isfile(gguf_path):
        raise ValueError(f"gguf_path: {gguf_path!r} is not a file")
    reader = gguf.GGUFReader(gguf_path)
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    architecture = metadata.get("general.architecture")
    if architecture != "llama":
        raise ValueError(f"gguf_path: architecture {architecture!r} is not supported; supported: ['llama']")
    dims = _read_dims(metadata)
    os.makedirs(out_dir, exist_ok=True)
    tensors = _read_tensors(reader, dims)
    logger.info("writing %d tensors of %s to %s", len(tensors), gguf_path, out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    special_ids = _special_token_ids(metadata)
    token_ids = {f"{name}_token_id": special_ids[name] for name in ("bos", "eos", "pad") if name in special_ids}
    is_tied = "lm_head.weight" not in tensors
    _write_json(out_dir, "config.json", _config_json(dims, token_ids, is_tied))
    _write_json(out_dir, "generation_config.json", token_ids)
    tokenizer = _build_tokenizer(metadata, special_ids)
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    _write_json(out_dir, "tokenizer_config.json", _tokenizer_config_json(metadata, special_ids, dims))


def _read_dims(metadata: dict) -> _LlamaDims:
    if metadata.get("llama.rope.scaling.type", "none") != "none":
        raise ValueError(f"gguf_path: rope scaling {metadata['llama.rope.scaling.type']!r} is not supported")
    hidden_size = int(metadata["llama.embedding_length"])
    num_heads = int(metadata["llama.attention.head_count"])
    return _LlamaDims(
        vocab_size=int(metadata.get("llama.vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
        hidden_size=hidden_size,
        intermediate_size=int(metadata["llama.feed_forward_length"]),
        num_hidden_layers=int(metadata["llama.block_count"]),
        num_attention_heads=num_heads,
        num_key_value_heads=int(metadata.get("llama.attention.head_count_kv", num_heads)),
        head_dim=int(metadata.get("llama.attention.key_length", hidden_size // num_heads)),
        max_position_embeddings=int(metadata["llama.context_length"]),
        rms_norm_eps=_shortest_float(metadata["llama.attention.layer_norm_rms_epsilon"]),
        rope_theta=_shortest_float(metadata.get("llama.rope.freq_base", 10000.0)),
    )


def _shortest_float(value: float) -> float:
    # GGUF stores float32: 1e-5 reads back as 9.99999974e-06. Print it the shortest way that
    # is still the same float32, as the HF config it came from spelled it.
    return float(str(np.float32(value)))


def _read_tensors(reader: gguf.GGUFReader, dims: _LlamaDims) -> dict[str, np.ndarray]:
    tensors = {}
    for tensor in reader.tensors:
        name = _hf_tensor_name(tensor.name)
        # GGUF lists dimensions innermost first; numpy (and HF) outermost first.
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        weight = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        weight = np.ascontiguousarray(weight.reshape(shape))
        if name.endswith("q_proj.weight"):
            weight = _unpermute_rope_rows(weight, dims.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = _unpermute_rope_rows(weight, dims.num_key_value_heads)
        tensors[name] = weight
    return tensors


def _hf_tensor_name(gguf_name: str) -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if suffix == "weight" and len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSOR_NAMES:
        return f"model.layers.{int(parts[1])}.{_LAYER_TENSOR_NAMES[parts[2]]}.weight"
    if suffix == "weight" and stem in _MODEL_TENSOR_NAMES:
        return f"{_MODEL_TENSOR_NAMES[stem]}.weight"
    raise ValueError(f"gguf_path: tensor {gguf_name!r} has no Hugging Face Llama counterpart")


def _unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order.

    HF keeps each head's rows as [first halves of the rotary pairs | second halves]; the
    convert script reorders them to (pair 0 first, pair 0 second, pair 1 first, ...).
    Rows of one head come back from (H/2, 2) order to (2, H/2) order.
    """
    num_rows, num_cols = weight.shape
    head_dim = num_rows // num_heads
    interleaved = weight.reshape(num_heads, head_dim // 2, 2, num_cols)
    return np.ascontiguousarray(interleaved.swapaxes(1, 2).reshape(num_rows, num_cols))


def _special_token_ids(metadata: dict) -> dict[str, int]:
    """{"bos": id, ...} for the special tokens the GGUF names."""
    keys = {name: f"tokenizer.ggml.{gguf_name}_token_id" for name, gguf_name in _SPECIAL_TOKENS.items()}
    return {name: int(metadata[key]) for name, key in keys.items() if key in metadata}


def _config_json(dims: _LlamaDims, token_ids: dict[str, int], is_tied: bool) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **dataclasses.asdict(dims),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_scaling": None,
        "tie_word_embeddings": is_tied,
        **token_ids,
        "torch_dtype": "float32",
    }


def _build_tokenizer(metadata: dict, special_ids: dict[str, int]) -> Tokenizer:
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"gguf_path: tokenizer model {kind!r} is not supported; supported: ['gpt2']")
    tokens = metadata["tokenizer.ggml.tokens"]
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ")) for merge in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "gpt2"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(metadata, special_ids)
    token_types = metadata.get("tokenizer.ggml.token_type", [])
    # Added tokens are matched whole before the BPE runs; control ones are also "special"
    # (dropped by skip_special_tokens), user-defined ones are not.
    tokenizer.add_special_tokens(_added_tokens(tokens, token_types, _TOKEN_TYPE_CONTROL))
    tokenizer.add_tokens(_added_tokens(tokens, token_types, _TOKEN_TYPE_USER_DEFINED))
    return tokenizer


def _added_tokens(tokens: list[str], token_types: list[int], token_type: int) -> list[AddedToken]:
    is_special = token_type == _TOKEN_TYPE_CONTROL
    return [
        AddedToken(tokens[token_id], special=is_special, normalized=False)
        for token_id, kind in enumerate(token_types)
        if kind == token_type
    ]


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE_TOKENIZER_SPLITS:
        raise ValueError(
            f"gguf_path: pre-tokenizer {pre!r} is not supported; supported: {sorted(_PRE_TOKENIZER_SPLITS)}"
        )
    splits = _PRE_TOKENIZER_SPLITS[pre]
    steps = [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits if split is not None]
    # ByteLevel maps bytes to the vocabulary's alphabet; it also runs the GPT-2 split where
    # the table asks for it.
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=None in splits))
    return pre_tokenizers.Sequence(steps)


def _post_processor(metadata: dict, special_ids: dict[str, int]) -> processors.PostProcessor:
    """Adds BOS/EOS around each sequence where the GGUF asks llama.cpp to."""
    tokens = metadata["tokenizer.ggml.tokens"]
    edges = {}
    for edge in ("bos", "eos"):
        if metadata.get(f"tokenizer.ggml.add_{edge}_token", False):
            edges[edge] = (tokens[special_ids[edge]], special_ids[edge])
    if not edges:
        return processors.ByteLevel(trim_offsets=False)
    head = [edges["bos"][0]] if "bos" in edges else []
    tail = [edges["eos"][0]] if "eos" in edges else []
    return processors.TemplateProcessing(
        single=" ".join([*head, "$A", *tail]),
        pair=" ".join([*head, "$A", *tail, *head, "$B:1", *tail]),
        special_tokens=sorted(set(edges.values())),
    )


def _tokenizer_config_json(metadata: dict, special_ids: dict[str, int], dims: _LlamaDims) -> dict:
    tokens = metadata["tokenizer.ggml.tokens"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": dims.max_position_embeddings,
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        # llama.cpp detokenizes without tidying spaces around punctuation; so does HF here.
        "clean_up_tokenization_spaces": False,
    }
    for name, token_id in special_ids.items():
        config[f"{name}_token"] = tokens[token_id]
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


def _write_json(out_dir: str, name: str, content: dict) -> None:
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, ensure_ascii=False)
        f.write("\n")
