"""The `gemma3` GGUF architecture (its text model) -> HF `Gemma3ForCausalLM`.

HF's Gemma RMSNorm computes `x * (1 + w)`; llama.cpp's convert script stores `w + 1` for every
norm (q/k norms included) so that its plain RMSNorm computes the same. `fix_weight`
subtracts the 1 again. Gemma's q/k rows are not permuted (unlike Llama's).

What the file does not state is what llama.cpp's Gemma 3 loader fixes, and so does this:
five sliding-window layers to one full-attention layer, local RoPE base 10000 (unless the
file gives `gemma3.rope.freq_base_swa`), queries scaled by 1/sqrt(head_dim) except on the
62-layer 27B model, which scales by 1/sqrt(hidden_size / num_heads).
"""

import numpy as np

from vjx.models.gguf.converter import GgufConverter
from vjx.models.gguf.gemma_chat_template import GEMMA_CHAT_TEMPLATE
from vjx.models.gguf.gemma_tokenizer import build_gemma_tokenizer
from vjx.models.gguf.metadata import decoder_dims, shortest_float, special_token_id_fields

_LAYER_TENSOR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_MODEL_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_SLIDING_WINDOW_PATTERN = 6
_LOCAL_ROPE_THETA = 10000.0
_NUM_LAYERS_27B = 62
_END_OF_TURN = "<end_of_turn>"
# google/gemma-3-270m's generation_config.json samples with these.
_SAMPLING_DEFAULTS = {"do_sample": True, "top_k": 64, "top_p": 0.95}


def _fix_weight(name: str, weight: np.ndarray, metadata: dict) -> np.ndarray:
    return weight - np.float32(1.0) if name.endswith("norm.weight") else weight


def _config_json(metadata: dict, is_tied: bool) -> dict:
    dims = decoder_dims(metadata)
    value_length = int(metadata.get("gemma3.attention.value_length", dims["head_dim"]))
    if value_length != dims["head_dim"]:
        raise ValueError(f"gguf_path: value_length {value_length} differs from key_length {dims['head_dim']}")
    num_layers = dims["num_hidden_layers"]
    is_27b = num_layers == _NUM_LAYERS_27B
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **dims,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": dims["hidden_size"] // dims["num_attention_heads"] if is_27b else dims["head_dim"],
        "sliding_window": int(metadata["gemma3.attention.sliding_window"]),
        "layer_types": [
            "full_attention" if (i + 1) % _SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
            for i in range(num_layers)
        ],
        "rope_parameters": _rope_parameters(metadata),
        "final_logit_softcapping": _optional_float(metadata, "gemma3.final_logit_softcapping"),
        "attn_logit_softcapping": _optional_float(metadata, "gemma3.attn_logit_softcapping"),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": is_tied,
        **special_token_id_fields(metadata),
        "torch_dtype": "float32",
    }


def _rope_parameters(metadata: dict) -> dict:
    """transformers 5's per-layer-type RoPE; the file's scaling applies to full attention only."""
    full = {"rope_type": "default", "rope_theta": shortest_float(metadata.get("gemma3.rope.freq_base", 1e6))}
    scaling = metadata.get("gemma3.rope.scaling.type", "none")
    if scaling == "linear":
        full = {**full, "rope_type": "linear", "factor": shortest_float(metadata["gemma3.rope.scaling.factor"])}
    elif scaling != "none":
        raise ValueError(f"gguf_path: rope scaling {scaling!r} is not supported; supported: ['linear', 'none']")
    local_theta = shortest_float(metadata.get("gemma3.rope.freq_base_swa", _LOCAL_ROPE_THETA))
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}


def _optional_float(metadata: dict, key: str) -> float | None:
    return shortest_float(metadata[key]) if key in metadata else None


def _generation_config_json(metadata: dict) -> dict:
    """The special ids, with `<end_of_turn>` as a second EOS (a chat reply ends there)."""
    config = special_token_id_fields(metadata)
    tokens = metadata["tokenizer.ggml.tokens"]
    if _END_OF_TURN in tokens and "eos_token_id" in config:
        config["eos_token_id"] = [config["eos_token_id"], tokens.index(_END_OF_TURN)]
    return {**config, **_SAMPLING_DEFAULTS}


GEMMA3 = GgufConverter(
    architecture="gemma3",
    layer_tensor_names=_LAYER_TENSOR_NAMES,
    model_tensor_names=_MODEL_TENSOR_NAMES,
    fix_weight=_fix_weight,
    config_json=_config_json,
    generation_config_json=_generation_config_json,
    build_tokenizer=build_gemma_tokenizer,
    chat_template=GEMMA_CHAT_TEMPLATE,
)
