"""Roofline arithmetic, exact, for the Llama-3.1-8B config in bfloat16 (numbers by hand)."""

import pytest

from benchmarks import roofline

H200 = roofline.DEVICE_PEAKS["NVIDIA H200"]
# Llama-3.1-8B: L=32, D=4096, N=32, K=8, H=128, F=14336, V=128256, untied, b=2.
LAYER_LINEAR = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336  # 218,103,808
WEIGHT_BYTES = 2 * (8_030_261_248 - 128256 * 4096)
KV_PER_TOKEN = 32 * 2 * 8 * 128 * 2


@pytest.fixture(scope="module")
def shape() -> roofline.ModelShape:
    return roofline.ModelShape.from_model_dir("benchmarks/configs/llama-3.1-8b", "bfloat16")


def test_params_and_per_step_bytes(shape):
    assert LAYER_LINEAR == 218_103_808
    assert shape.layer_linear_params == LAYER_LINEAR
    assert shape.num_params == 8_030_261_248  # the published parameter count
    assert shape.weight_bytes_per_step == WEIGHT_BYTES == 15_009_849_344
    assert shape.kv_bytes_per_token == KV_PER_TOKEN == 131_072


def test_decode_step_bytes(shape):
    # First decode step after a 32-token prompt: 33 keys read, one token's KV written.
    assert roofline.step_bytes(shape, [(1, 33)]) == WEIGHT_BYTES + 4096 * 2 + 34 * KV_PER_TOKEN == 15_014_313_984
    # Batch 8 at the mean context of 127 decode steps (s from 33 to 159: mean 96).
    mean = roofline.mean_decode_requests(8, 32, 128)
    assert mean == [(1, 96.0)] * 8
    assert roofline.step_bytes(shape, mean) == WEIGHT_BYTES + 8 * 8192 + (8 * 96 + 8) * KV_PER_TOKEN == 15_111_626_752


def test_step_flops(shape):
    prefill = 2 * 256 * 32 * LAYER_LINEAR + 2 * 8 * 4096 * 128256 + 4 * 32 * 128 * 32 * 8 * (32 * 33 // 2)
    assert roofline.step_flops(shape, [(32, 32)] * 8) == prefill == 3_584_032_768_000
    decode = 2 * 32 * LAYER_LINEAR + 2 * 4096 * 128256 + 4 * 32 * 128 * 32 * 33
    assert roofline.step_flops(shape, [(1, 33)]) == decode == 15_026_618_368
    # A chunk of 16 tokens after 100 cached: query i sees 100 + i + 1 keys.
    pairs = sum(100 + i + 1 for i in range(16))
    assert roofline.step_flops(shape, [(16, 116)]) == (
        2 * 16 * 32 * LAYER_LINEAR + 2 * 4096 * 128256 + 4 * 32 * 128 * 32 * pairs
    )


def test_request_flops_is_prefill_plus_decode_steps(shape):
    n = 512 + 512 - 1
    expected = 2 * n * 32 * LAYER_LINEAR + 2 * 512 * 4096 * 128256 + 4 * 32 * 128 * 32 * (n * (n + 1) // 2)
    assert roofline.request_flops(shape, 512, 512) == expected
    steps = roofline.step_flops(shape, [(32, 32)]) + sum(roofline.step_flops(shape, [(1, s)]) for s in range(33, 160))
    assert roofline.request_flops(shape, 32, 128) == steps


def test_latency_floor_and_fractions(shape):
    # Prefill of 8 x 32 is compute-bound on the H200; every decode step is bandwidth-bound.
    decode_bytes = 127 * (WEIGHT_BYTES + 8 * 8192) + 8 * KV_PER_TOKEN * sum(range(34, 161))
    assert decode_bytes == 1_919_176_597_504
    floor = 3_584_032_768_000 / 989e12 + decode_bytes / 4.8e12
    assert roofline.batch_latency_floor_s(shape, 8, 32, 128, H200) == pytest.approx(floor, rel=1e-12)
    fields = roofline.latency_roofline(
        shape, H200, (8, 32, 128), {"latency_s": 0.5, "prefill_s": 0.01, "decode_step_s": 0.004}
    )
    assert fields["latency_roofline_fraction"] == pytest.approx(floor / 0.5, rel=1e-12)
    assert fields["decode_hbm_fraction"] == pytest.approx(15_111_626_752 / 0.004 / 4.8e12, rel=1e-12)
    assert fields["prefill_tensor_core_fraction"] == pytest.approx(3_584_032_768_000 / 0.01 / 989e12, rel=1e-12)


def test_unknown_device_has_no_fractions(shape):
    fields = roofline.latency_roofline(shape, None, (1, 32, 128), {"latency_s": 0.5, "decode_step_s": 0.004})
    assert fields["decode_hbm_fraction"] is None and fields["latency_floor_s"] is None
    tput = roofline.throughput_roofline(shape, None, [(512, 512)], 1.0)
    assert tput == {"model_flops": roofline.request_flops(shape, 512, 512), "tensor_core_fraction": None}


def test_tied_and_float32_shapes():
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "tie_word_embeddings": True,
    }
    shape = roofline.ModelShape.from_hf_config(config, "float32")
    layer = 64 * 64 + 2 * 64 * 64 + 64 * 64 + 3 * 64 * 128
    assert (shape.num_kv_heads, shape.head_dim) == (4, 16)
    assert shape.num_params == 256 * 64 + 2 * (layer + 2 * 64) + 64
    assert shape.weight_bytes_per_step == 4 * shape.num_params  # the LM head reads the tied table
    assert shape.kv_bytes_per_token == 2 * 2 * 4 * 16 * 4


def test_bad_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="dtype must be one of"):
        roofline.dtype_bytes("int8")


def test_main_prints_the_table(capsys):
    assert roofline.main(["--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "| params | 8,030,261,248 |" in out
    assert "| whole-batch latency floor | 403.5 ms |" in out
