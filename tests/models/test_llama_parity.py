"""vjx's Llama against Hugging Face's: tiny random checkpoints, float32 logits of every position.

Each config is saved by `transformers` as safetensors and read back by vjx's real loader; the
prompt runs as one request through the reference backend with a shuffled, non-contiguous
block table. All prompts of a config share one padded shape, so one compile serves them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import ReferenceBackend
from vjx.config import ModelConfig
from vjx.models.loader import get_model

NUM_TOKENS = 384  # T: every prefill is padded to this
NUM_ROWS = 2  # R: row 1 is a padding row
BLOCK_SIZE = 16
NUM_BLOCKS = 40
WIDTH = NUM_TOKENS // BLOCK_SIZE  # W
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
    vocab_size=VOCAB, intermediate_size=256, num_hidden_layers=2, max_position_embeddings=512,
    attn_implementation="eager",
)
CONFIGS = {
    "gqa1_hd64_tied_bias": dict(
        hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
    ),
    "gqa2_hd64_untied_llama3": dict(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        tie_word_embeddings=False, rope_scaling=LLAMA3_SCALING,
    ),
    "gqa4_hd128_tied_llama3_sharded": dict(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
        tie_word_embeddings=True, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0,
    ),
}
SHARDED = {"gqa4_hd128_tied_llama3_sharded"}


def randomize_(hf_model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that logits are O(1): HF's init (std 0.02) would hide errors."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            elif "embed" in name:  # also the tied LM head: logits of std ~2
                param.copy_(noise * 2.0 / param.shape[1] ** 0.5)
            elif param.ndim == 1:
                param.copy_(0.1 * noise)
            else:
                param.copy_(noise / param.shape[1] ** 0.5)


def save_and_load(tmp_dir, hf_config, *, seed=0, max_shard_size="50GB"):
    """The HF model (float32, eval) and vjx's model loaded from its safetensors files."""
    torch.manual_seed(seed)
    model_cls = getattr(transformers, hf_config.architectures[0])
    hf_model = model_cls(hf_config).eval()
    randomize_(hf_model, seed)
    hf_model.save_pretrained(tmp_dir, max_shard_size=max_shard_size)
    config = ModelConfig(
        model=str(tmp_dir), tokenizer=str(tmp_dir),
        hf_config=transformers.AutoConfig.from_pretrained(tmp_dir),
        dtype="float32", max_model_len=NUM_TOKENS, seed=0, load_format="auto",
    )
    return hf_model, get_model(config, ReferenceBackend())


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _step(graphdef, state, kv_caches, input_ids, positions, md):
    model = nnx.merge(graphdef, state)
    hidden, kv_caches = model(input_ids, positions, kv_caches, [md] * len(kv_caches))
    return model.compute_logits(hidden), kv_caches


def prefill(model, token_ids, num_cached, block_ids, kv_caches):
    """Runs `token_ids` as one request whose first `num_cached` tokens are already cached."""
    num_new = len(token_ids)
    positions = np.arange(num_cached, num_cached + num_new)
    slots = np.asarray(block_ids)[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    pad = NUM_TOKENS - num_new
    block_table = np.zeros((NUM_ROWS, WIDTH), np.int32)
    block_table[0, : len(block_ids)] = block_ids
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(np.pad(slots, (0, pad)), jnp.int32),
        query_start_loc=jnp.asarray([0, num_new, num_new], jnp.int32),
        seq_lens=jnp.asarray([num_cached + num_new, 0], jnp.int32),
        block_tables=jnp.asarray(block_table),
        num_seqs=jnp.asarray([1], jnp.int32),
    )
    graphdef, state = nnx.split(model)
    logits, kv_caches = _step(
        graphdef, state, kv_caches,
        jnp.asarray(np.pad(token_ids, (0, pad)), jnp.int32),
        jnp.asarray(np.pad(positions, (0, pad)), jnp.int32),
        md,
    )
    return np.asarray(logits)[:num_new], kv_caches


def empty_caches(hf_config):
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )
    shape = ReferenceBackend().kv_cache_shape(
        NUM_BLOCKS, BLOCK_SIZE, hf_config.num_key_value_heads, head_dim
    )
    # Committed like the caches a step returns, so the second chunk reuses the compiled step.
    zeros = jax.device_put(np.zeros(shape, np.float32), jax.devices()[0])
    return [zeros.copy() for _ in range(hf_config.num_hidden_layers)]


def random_blocks(seed):
    """A shuffled, non-contiguous block table that never uses the scratch block 0."""
    return list(np.random.default_rng(seed).permutation(np.arange(1, NUM_BLOCKS))[:WIDTH])


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
        **COMMON, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        sliding_window=48, tie_word_embeddings=False,
    )
    hf_config.architectures = ["MistralForCausalLM"]
    hf_model, model = save_and_load(tmp_path, hf_config, seed=1)
    assert type(model).__name__ == "LlamaForCausalLM"
    token_ids = np.random.default_rng(7).integers(0, VOCAB, 150)
    logits, _ = prefill(model, token_ids, 0, random_blocks(7), empty_caches(hf_config))
    np.testing.assert_allclose(logits, hf_logits(hf_model, token_ids), atol=ATOL, rtol=0)
