"""Tiny random configs of every dense family vjx implements, built with `transformers`.

Each has 4 query heads and 2 KV heads (tensor parallelism of 2 and 4 splits them evenly and,
at 4, repeats each KV head), head_dim 16 (Qwen 3: 32, not hidden / heads), hidden 64 and a
vocabulary of 296 inside the test tokenizer's ids. Every feature the family file implements
is switched on with a value that changes the logits: sliding windows shorter than the long
prompt, soft-caps low enough to bite, Granite's multipliers away from one, LongRoPE's long
factors.
"""

import transformers

VOCAB = 296
WINDOW = 32
"""The sliding window of every windowed config: shorter than the long prompts."""

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)


def _gemma3_rope() -> dict:
    return {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }


def _longrope() -> dict:
    planes = COMMON["head_dim"] // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(planes)],
        "long_factor": [1.0 + 0.7 * i for i in range(planes)],
        "original_max_position_embeddings": 64,
    }


FAMILIES = {
    "qwen2": lambda: transformers.Qwen2Config(
        **COMMON,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
    ),
    "qwen3": lambda: transformers.Qwen3Config(
        **{**COMMON, "head_dim": 32},
        num_hidden_layers=2,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "gemma2": lambda: transformers.Gemma2Config(
        **COMMON,
        num_hidden_layers=3,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        attn_logit_softcapping=5.0,
        final_logit_softcapping=10.0,
        tie_word_embeddings=False,
    ),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **COMMON,
        num_hidden_layers=4,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters=_gemma3_rope(),
    ),
    "phi3": lambda: transformers.Phi3Config(**COMMON, num_hidden_layers=2, sliding_window=WINDOW),
    "phi3_longrope": lambda: transformers.Phi3Config(
        **COMMON, num_hidden_layers=2, original_max_position_embeddings=64, rope_parameters=_longrope()
    ),
    "olmo2": lambda: transformers.Olmo2Config(**COMMON, num_hidden_layers=2),
    "granite": lambda: transformers.GraniteConfig(
        **COMMON,
        num_hidden_layers=2,
        embedding_multiplier=4.0,
        attention_multiplier=0.0625,
        residual_multiplier=0.5,
        logits_scaling=2.0,
    ),
}
"""Family name -> a function building its config (the architecture is set by `family_config`)."""

ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phi3_longrope": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "granite": "GraniteForCausalLM",
}

MIN_PROMPT_LEN = {"phi3_longrope": 65}
"""Shortest prompt transformers runs with the long factors (longer than the original 64
positions) - the factors vjx uses for every position when max_model_len exceeds them."""


def family_config(name: str):
    config = FAMILIES[name]()
    config.architectures = [ARCHITECTURES[name]]
    return config
