"""RoPE variants against transformers' own frequency tables (`ROPE_INIT_FUNCTIONS`): the
per-layer-type parameters of Gemma 3 and LongRoPE's choice of factors."""

import numpy as np
import pytest
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

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


def test_partial_rotary_factor_is_refused():
    config = family_config("phi3")
    config.rope_parameters = {**config.rope_parameters, "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor must be 1.0, got 0.5"):
        RotaryEmbedding.from_hf_config(config, config.head_dim)
