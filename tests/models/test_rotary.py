"""RoPE variants against transformers' own frequency tables (`ROPE_INIT_FUNCTIONS`): the
per-layer-type parameters of Gemma 3, LongRoPE's choice of factors and YaRN's ramp and
attention factor."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bamba.modeling_bamba import BambaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.qwen3 import modeling_qwen3

from tests.helpers.families import family_config
from vjx.models.layers.rotary import RotaryEmbedding


@pytest.mark.parametrize("max_model_len, seq_len", [(64, None), (65, 65), (512, 65)])
def test_longrope_factors_follow_max_model_len(max_model_len, seq_len):
    """Short factors while the engine's context fits the original 64 positions, long ones past
    it, for every position (transformers picks by the current length, here `seq_len`)."""
    config = family_config("phi3_longrope")
    ours = RotaryEmbedding.from_hf_config(config, config.head_dim, max_model_len=max_model_len)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=seq_len)
    np.testing.assert_array_equal(np.asarray(ours.inv_freq, np.float32), inv_freq.numpy())
    assert ours.attention_scaling == pytest.approx(attention_factor, rel=1e-12)
    assert ours.attention_scaling > 1.0


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_gemma3_rotates_each_layer_type_with_its_parameters(layer_type):
    config = family_config("gemma3")
    ours = RotaryEmbedding.from_hf_config(config, config.head_dim, layer_type=layer_type)
    rope_type = config.rope_parameters[layer_type]["rope_type"]
    # transformers 5 computes plain RoPE in the model class, not in the table.
    init = ROPE_INIT_FUNCTIONS.get(rope_type, Gemma3RotaryEmbedding.compute_default_rope_parameters)
    inv_freq, _ = init(config, layer_type=layer_type)
    np.testing.assert_array_equal(np.asarray(ours.inv_freq, np.float32), inv_freq.numpy())


def test_partial_rotary_factor_rotates_the_leading_dims_only():
    """Bamba's factor 0.5: HF's frequencies over the first half of each head, the rest passed through."""
    config = transformers.BambaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    assert config.rope_parameters["partial_rotary_factor"] == 0.5
    ours = RotaryEmbedding.from_hf_config(config, 16)
    inv_freq, _ = BambaRotaryEmbedding.compute_default_rope_parameters(config)
    np.testing.assert_array_equal(np.asarray(ours.inv_freq, np.float32), inv_freq.numpy())
    x = np.random.default_rng(0).standard_normal((5, 2, 16)).astype(np.float32)
    positions = np.arange(3, 8)
    rotated = np.asarray(ours(jnp.asarray(x), jnp.asarray(positions)))
    np.testing.assert_array_equal(rotated[..., 8:], x[..., 8:])
    cos, sin = BambaRotaryEmbedding(config)(torch.as_tensor(x), torch.as_tensor(positions)[None])
    expected, _ = apply_rotary_pos_emb(torch.as_tensor(x)[None], torch.as_tensor(x)[None], cos, sin, unsqueeze_dim=2)
    np.testing.assert_allclose(rotated, expected[0].numpy(), atol=1e-6, rtol=0)


def test_a_partial_rotary_factor_of_odd_dims_is_refused():
    config = family_config("phi3")
    config.rope_parameters = {**config.rope_parameters, "partial_rotary_factor": 0.1875}
    with pytest.raises(ValueError, match=r"partial_rotary_factor must be in \(0, 1\] .* got 0.1875 \(3 dims\)"):
        RotaryEmbedding.from_hf_config(config, 16)


def _yarn_config(name: str):
    """gpt-oss as published (bounds not truncated), Qwen 3 extended 4x (`truncate` left to
    its default), DeepSeek's parameters with `mscale` and `mscale_all_dim` that differ."""
    if name == "gpt_oss":
        return transformers.GptOssConfig()
    qwen3 = {"rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768}
    deepseek = {
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    }
    params = {"qwen3": qwen3, "deepseek": deepseek}[name]
    max_len = int(params["factor"] * params["original_max_position_embeddings"])
    return transformers.Qwen3Config(
        head_dim=64, max_position_embeddings=max_len, rope_parameters={"rope_type": "yarn", **params}
    )


YARN_CASES = [("gpt_oss", 1, 2e-3), ("qwen3", 0, 1e-5), ("deepseek", 0, 1e-5)]
"""Config, ulps and rotation tolerance. torch's vectorized `theta ** exponents` lands one ulp off
the correctly rounded power (vjx's, and torch's own one-element result) in planes 6 and 10 at
gpt-oss's theta 150000; times positions up to 131071 that ulp moves an angle by ~1e-3."""


@pytest.mark.parametrize("name, max_ulp", [(name, max_ulp) for name, max_ulp, _ in YARN_CASES])
def test_yarn_matches_transformers(name, max_ulp):
    config = _yarn_config(name)
    ours = RotaryEmbedding.from_hf_config(config, config.head_dim)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    np.testing.assert_array_max_ulp(np.asarray(ours.inv_freq, np.float32), inv_freq.numpy(), maxulp=max_ulp)
    assert ours.attention_scaling == attention_factor
    assert ours.attention_scaling != 1.0


@pytest.mark.parametrize("name, atol", [(name, atol) for name, _, atol in YARN_CASES])
def test_yarn_rotation_matches_transformers(name, atol):
    """q rotated by the model's own rotary module and `apply_rotary_pos_emb` (gpt-oss's
    halves, Qwen 3's rotate_half) at positions across the extended context."""
    config = _yarn_config(name)
    modeling = modeling_gpt_oss if name == "gpt_oss" else modeling_qwen3
    rotary = getattr(modeling, "GptOssRotaryEmbedding" if name == "gpt_oss" else "Qwen3RotaryEmbedding")(config)
    positions = np.array([0, 1, 7, 100, 4095, 4096, 30000, config.max_position_embeddings - 1])
    q_TNH = np.random.default_rng(0).standard_normal((len(positions), 2, config.head_dim)).astype(np.float32)
    q = torch.from_numpy(q_TNH).transpose(0, 1)[None]
    cos, sin = rotary(q, torch.from_numpy(positions)[None])
    want, _ = modeling.apply_rotary_pos_emb(q, q, cos, sin)
    ours = RotaryEmbedding.from_hf_config(config, config.head_dim)
    got = ours(jnp.asarray(q_TNH), jnp.asarray(positions, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), want[0].transpose(0, 1).numpy(), rtol=0, atol=atol)
