"""The `llama` GGUF architecture -> HF `LlamaForCausalLM`.

llama.cpp's convert script permutes the rows of q_proj and k_proj so that each head's rotary
pairs are interleaved (GPT-J style RoPE); `fix_weight` reverses that, so the weights fit HF's
rotate_half layout, the one HF checkpoints (and vjx's loader) use.
"""

import numpy as np

from vjx.models.gguf.bpe_tokenizer import build_bpe_tokenizer
from vjx.models.gguf.converter import GgufConverter
from vjx.models.gguf.metadata import decoder_dims, shortest_float, special_token_id_fields

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


def _fix_weight(name: str, weight: np.ndarray, metadata: dict) -> np.ndarray:
    dims = decoder_dims(metadata)
    if name.endswith("q_proj.weight"):
        return _unpermute_rope_rows(weight, dims["num_attention_heads"])
    if name.endswith("k_proj.weight"):
        return _unpermute_rope_rows(weight, dims["num_key_value_heads"])
    return weight


def _unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order.

    HF keeps each head's rows as [first halves of the rotary pairs | second halves]; the
    convert script reorders them to (pair 0 first, pair 0 second, pair 1 first, ...).
    Rows of one head come back from (H/2, 2) order to (2, H/2) order.
    """
    num_rows, num_cols = weight.shape
    head_dim = num_rows // num_heads
    interleaved = weight.reshape(num_heads, head_dim // 2, 2, num_cols)
    return interleaved.swapaxes(1, 2).reshape(num_rows, num_cols)


def _config_json(metadata: dict, is_tied: bool) -> dict:
    if metadata.get("llama.rope.scaling.type", "none") != "none":
        raise ValueError(f"gguf_path: rope scaling {metadata['llama.rope.scaling.type']!r} is not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **decoder_dims(metadata),
        "rope_theta": shortest_float(metadata.get("llama.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_scaling": None,
        "tie_word_embeddings": is_tied,
        **special_token_id_fields(metadata),
        "torch_dtype": "float32",
    }


LLAMA = GgufConverter(
    architecture="llama",
    layer_tensor_names=_LAYER_TENSOR_NAMES,
    model_tensor_names=_MODEL_TENSOR_NAMES,
    fix_weight=_fix_weight,
    config_json=_config_json,
    generation_config_json=special_token_id_fields,
    build_tokenizer=build_bpe_tokenizer,
)
