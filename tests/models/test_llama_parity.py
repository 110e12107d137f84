"""vjx's Llama against Hugging Face's: tiny random checkpoints, float32 logits of every position.

Each config is saved by `transformers` as safetensors and read back by vjx's real loader; the
prompt runs as one request through the reference backend with a shuffled, non-contiguous
block table. All prompts of a config share one padded shape, so one compile serves them.
"""

import numpy as np
import pytest
import torch
import transformers

from tests.helpers.families import float32_model_config
from tests.helpers.model_steps import NUM_TOKENS, empty_caches, prefill, random_blocks
from tests.helpers.tiny_llama import randomize_
from vjx.attention.reference import ReferenceBackend
from vjx.models.loader import get_model

VOCAB = 512
ATOL = 1e-4

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
COMMON = dict(
    vocab_size=VOCAB,
    intermediate_size=256,
    num_hidden_layers=2,
    max_position_embeddings=512,
    attn_implementation="eager",
)
CONFIGS = {
    "gqa1_hd64_tied_bias": dict(
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
    ),
    "gqa2_hd64_untied_llama3": dict(
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=False,
        rope_scaling=LLAMA3_SCALING,
    ),
    "gqa4_hd128_tied_llama3_sharded": dict(
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        tie_word_embeddings=True,
        rope_scaling=LLAMA3_SCALING,
        rope_theta=500000.0,
    ),
}
SHARDED = {"gqa4_hd128_tied_llama3_sharded"}


def save_and_load(tmp_dir, hf_config, *, seed=0, max_shard_size="50GB"):
    """The HF model (float32, eval) and vjx's model loaded from its safetensors files."""
    torch.manual_seed(seed)
    model_cls = getattr(transformers, hf_config.architectures[0])
    hf_model = model_cls(hf_config).eval()
    randomize_(hf_model, seed)
    hf_model.save_pretrained(tmp_dir, max_shard_size=max_shard_size)
    return hf_model, get_model(float32_model_config(tmp_dir, NUM_TOKENS), ReferenceBackend())


def hf_logits(hf_model, token_ids):
    with torch.no_grad():
        return hf_model(torch.as_tensor(token_ids)[None]).logits[0].float().numpy()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def loaded(request, tmp_path_factory):
    name = request.param
    hf_config = transformers.LlamaConfig(**COMMON, **CONFIGS[name])
    hf_config.architectures = ["LlamaForCausalLM"]
    tmp_dir = tmp_path_factory.mktemp(name)
    max_shard_size = "200KB" if name in SHARDED else "50GB"
    hf_model, model = save_and_load(tmp_dir, hf_config, max_shard_size=max_shard_size)
    if name in SHARDED:
        assert (tmp_dir / "model.safetensors.index.json").exists()
    return name, hf_config, hf_model, model


@pytest.mark.parametrize("num_tokens", [7, 320])
def test_prefill_logits_match_hf(loaded, num_tokens):
    _, hf_config, hf_model, model = loaded
    token_ids = np.random.default_rng(num_tokens).integers(0, VOCAB, num_tokens)
    logits, _ = prefill(model, token_ids, 0, random_blocks(num_tokens), empty_caches(hf_config))
    expected = hf_logits(hf_model, token_ids)
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero logits
    np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=0)


def test_two_chunk_prefill_reads_first_chunk_from_cache(loaded):
    _, hf_config, hf_model, model = loaded
    token_ids = np.random.default_rng(5).integers(0, VOCAB, 320)
    blocks = random_blocks(5)
    first, kv_caches = prefill(model, token_ids[:200], 0, blocks, empty_caches(hf_config))
    second, _ = prefill(model, token_ids[200:], 200, blocks, kv_caches)
    expected = hf_logits(hf_model, token_ids)
    np.testing.assert_allclose(np.concatenate([first, second]), expected, atol=ATOL, rtol=0)


def test_mistral_with_sliding_window_matches_hf(tmp_path):
    hf_config = transformers.MistralConfig(
        **COMMON,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=48,
        tie_word_embeddings=False,
    )
    hf_config.architectures = ["MistralForCausalLM"]
    hf_model, model = save_and_load(tmp_path, hf_config, seed=1)
    assert type(model).__name__ == "LlamaForCausalLM"
    token_ids = np.random.default_rng(7).integers(0, VOCAB, 150)
    logits, _ = prefill(model, token_ids, 0, random_blocks(7), empty_caches(hf_config))
    np.testing.assert_allclose(logits, hf_logits(hf_model, token_ids), atol=ATOL, rtol=0)
