"""Tiny random configs of every family vjx implements, built with `transformers`.

Each has 4 query heads and 2 KV heads (tensor parallelism of 2 and 4 splits them evenly and,
at 4, repeats each KV head), head_dim 16 (Qwen 3: 32, not hidden / heads), hidden 64 and a
vocabulary of 296 inside the test tokenizer's ids. Every feature the family file implements
is switched on with a value that changes the logits: sliding windows shorter than the long
prompt, soft-caps low enough to bite, Granite's multipliers away from one, LongRoPE's long
factors, MoE layers mixed with dense ones, shared experts, renormalized and raw routing weights.
"""

import jax
import numpy as np
import torch
import transformers

from tests.helpers.model_steps import BLOCK_SIZE, NUM_BLOCKS, prefill, random_blocks
from tests.helpers.tiny_llama import randomize_
from vjx.attention.reference import ReferenceBackend
from vjx.config import ModelConfig
from vjx.models.loader import get_model
from vjx.sharding.placement import num_cache_kv_heads
from vjx.sharding.rules import logical_sharding
from vjx.worker.kv_cache_layout import kv_cache_axes, kv_cache_shape

VOCAB = 296
MAX_MODEL_LEN = 512
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


def _gpt_oss_yarn() -> dict:
    """gpt-oss's YaRN (no truncation), over an original context the long prompts exceed."""
    return {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 8.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
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
    "mixtral": lambda: transformers.MixtralConfig(
        **COMMON, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW
    ),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=96,
        mlp_only_layers=[1],
        norm_topk_prob=False,
    ),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        decoder_sparse_step=2,
        norm_topk_prob=True,
    ),
    "gpt_oss": lambda: transformers.GptOssConfig(
        **COMMON,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=_gpt_oss_yarn(),
    ),
}
"""Family name -> a function building its config (the architecture is set by `family_config`)."""

_MLA = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, head_dim=8, num_key_value_heads=4)
"""DeepSeek's latent attention (its rotary width is transformers' `head_dim`; keys expand to every head)."""
_DEEPSEEK_MOE = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)


def _deepseek_yarn() -> dict:
    """DeepSeek-V3's YaRN with mscale_all_dim (which also scales q.k), over an original
    context the long prompts exceed."""
    return {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 64,
    }


FAMILIES.update(
    {
        "deepseek_v2_lite": lambda: transformers.DeepseekV2Config(
            **{**COMMON, **_MLA},
            **_DEEPSEEK_MOE,
            num_hidden_layers=2,
            q_lora_rank=None,
            first_k_dense_replace=1,
            topk_method="greedy",
        ),
        "deepseek_v2": lambda: transformers.DeepseekV2Config(
            **{**COMMON, **_MLA},
            **_DEEPSEEK_MOE,
            num_hidden_layers=2,
            q_lora_rank=24,
            first_k_dense_replace=0,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=1,
            routed_scaling_factor=2.0,
        ),
        "deepseek_v3": lambda: transformers.DeepseekV3Config(
            **{**COMMON, **_MLA},
            **_DEEPSEEK_MOE,
            num_hidden_layers=3,
            q_lora_rank=24,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_interleave=True,
            rope_parameters=_deepseek_yarn(),
        ),
    }
)

FAMILIES["mamba2"] = lambda: transformers.Mamba2Config(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_heads=8,
    head_dim=16,
    expand=2,
    n_groups=2,
    state_size=16,
    conv_kernel=4,
    chunk_size=32,
    use_conv_bias=True,
    use_bias=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)
"""Mamba2: 8 heads of 16 in 2 groups, state 16, chunks of 32 (the long prompts span ten)."""

FAMILIES["bamba"] = lambda: transformers.BambaConfig(
    **COMMON,
    num_hidden_layers=3,
    attn_layer_indices=[1],
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_chunk_size=32,
    mamba_conv_bias=True,
)
"""Bamba: Mamba2, attention (rotating half of each head), Mamba2; each with a gated MLP."""

ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phi3_longrope": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v2_lite": "DeepseekV2ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "bamba": "BambaForCausalLM",
}

MIN_PROMPT_LEN = {"phi3_longrope": 65}
"""Shortest prompt transformers runs with the long factors (longer than the original 64
positions) - the factors vjx uses for every position when max_model_len exceeds them."""


def family_config(name: str):
    config = FAMILIES[name]()
    config.architectures = [ARCHITECTURES[name]]
    return config


def float32_model_config(model_dir, max_model_len: int = MAX_MODEL_LEN) -> ModelConfig:
    """The `ModelConfig` that loads the checkpoint in `model_dir` in float32."""
    return ModelConfig(
        model=str(model_dir),
        tokenizer=str(model_dir),
        hf_config=transformers.AutoConfig.from_pretrained(model_dir),
        dtype="float32",
        max_model_len=max_model_len,
        seed=0,
        load_format="auto",
    )


class Family:
    """One family's HF model and vjx's, loaded from the same directory."""

    def __init__(self, name: str, model_dir):
        self.name = name
        self.hf_config = family_config(name)
        torch.manual_seed(0)
        self.hf_model = getattr(transformers, self.hf_config.architectures[0])(self.hf_config).eval()
        self.hf_model.config._attn_implementation = "eager"
        self.hf_model.config._experts_implementation = "eager"
        randomize_(self.hf_model, 0)
        self.hf_model.save_pretrained(model_dir)
        self.model_config = float32_model_config(model_dir)
        self.model = get_model(self.model_config, ReferenceBackend())

    def hf_logits(self, token_ids) -> np.ndarray:
        with torch.no_grad():
            return self.hf_model(torch.as_tensor(np.asarray(token_ids))[None]).logits[0].float().numpy()

    def caches(self, tensor_parallel_size: int = 1, mesh=None) -> list[jax.Array]:
        """Zeroed caches of every layer, laid out as the engine lays them out for its spec."""
        text, backend = self.model_config.hf_text_config, ReferenceBackend()
        # A state-space model has no KV heads; its layers' specs do not read the count.
        num_kv_heads = num_cache_kv_heads(getattr(text, "num_key_value_heads", 1), tensor_parallel_size)
        specs = self.model.get_kv_cache_spec(BLOCK_SIZE, num_kv_heads, "float32").values()
        return [
            jax.device_put(
                np.zeros(kv_cache_shape(backend, spec, NUM_BLOCKS, num_state_slots=NUM_BLOCKS), np.float32),
                jax.devices()[0] if mesh is None else logical_sharding(mesh, kv_cache_axes(backend, spec)),
            )
            for spec in specs
        ]

    def logits(self, token_ids, seed: int = 0) -> np.ndarray:
        logits, _ = prefill(self.model, token_ids, 0, random_blocks(seed), self.caches())
        return logits
