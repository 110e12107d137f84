"""Reading a GGUF's key-value metadata under HF's names.

Keys are llama.cpp's (`<arch>.embedding_length`, `tokenizer.ggml.bos_token_id`, ...); the
values come back as plain Python (`str`, `int`, `float`, `bool`, lists of them).
"""

import gguf
import numpy as np

# HF's special token name -> llama.cpp's, as in `tokenizer.ggml.<name>_token_id`.
_SPECIAL_TOKENS = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}


def read_metadata(reader: gguf.GGUFReader) -> dict:
    """Every metadata field of the file, by key."""
    return {name: field.contents() for name, field in reader.fields.items()}


def shortest_float(value: float) -> float:
    """`value` as the shortest decimal that is still the same float32.

    GGUF stores float32: 1e-5 reads back as 9.99999974e-06. Printing it back the shortest way
    gives the number the HF config it came from spelled.
    """
    return float(str(np.float32(value)))


def decoder_dims(metadata: dict) -> dict:
    """The shape every decoder-only GGUF states, under HF's config names."""
    arch = metadata["general.architecture"]
    hidden_size = int(metadata[f"{arch}.embedding_length"])
    num_heads = int(metadata[f"{arch}.attention.head_count"])
    return {
        "vocab_size": int(metadata.get(f"{arch}.vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
        "hidden_size": hidden_size,
        "intermediate_size": int(metadata[f"{arch}.feed_forward_length"]),
        "num_hidden_layers": int(metadata[f"{arch}.block_count"]),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(metadata.get(f"{arch}.attention.head_count_kv", num_heads)),
        "head_dim": int(metadata.get(f"{arch}.attention.key_length", hidden_size // num_heads)),
        "max_position_embeddings": int(metadata[f"{arch}.context_length"]),
        "rms_norm_eps": shortest_float(metadata[f"{arch}.attention.layer_norm_rms_epsilon"]),
    }


def special_token_ids(metadata: dict) -> dict[str, int]:
    """{"bos": id, ...} for the special tokens the GGUF names."""
    keys = {name: f"tokenizer.ggml.{gguf_name}_token_id" for name, gguf_name in _SPECIAL_TOKENS.items()}
    return {name: int(metadata[key]) for name, key in keys.items() if key in metadata}


def special_token_id_fields(metadata: dict) -> dict[str, int]:
    """`bos_token_id`, `eos_token_id`, `pad_token_id`, as config.json spells them."""
    special_ids = special_token_ids(metadata)
    return {f"{name}_token_id": special_ids[name] for name in ("bos", "eos", "pad") if name in special_ids}
