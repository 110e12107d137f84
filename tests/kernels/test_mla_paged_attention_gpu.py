"""The Triton-compiled MLA kernel on the GPU at DeepSeek-V3 widths (run with `pytest -m gpu`).

128 query heads, latents of 512 + 64, 16-key pages, the shipped knobs: a ragged step of
decode rows at 4k keys (split into segments), a prefill chunk over a cached prefix, a fresh
prompt and padding tokens, then decode-only and prefill steps, each against the reference
(vjx/attention/mla.py) and timed (printed; run with `-s` to see the times).
"""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.kernels.attention_cases import gpu_time_ms
from tests.kernels.test_mla_paged_attention import StepShape, check, inputs, kernel, make_step, reference

pytestmark = pytest.mark.gpu

KV_LORA_RANK = 512
LATENT_DIM = 512 + 64
SHAPE = StepShape(num_tokens=512, num_rows=8, num_heads=128, latent_dim=LATENT_DIM, page_size=16, max_model_len=4608)


def _timed(step, dtype, label: str, kv_bytes: int, flops: int) -> None:
    """Prints the kernel's and the reference's median times (write included in both)."""
    sm_scale = LATENT_DIM**-0.5
    args = inputs(step, dtype)
    ours, how = gpu_time_ms(lambda: kernel(*args, sm_scale, KV_LORA_RANK, None, False))
    ref, _ = gpu_time_ms(lambda: reference(*args, sm_scale, KV_LORA_RANK), iterations=5)
    print(
        f"\n{label} ({jax.devices()[0].device_kind}, {how}): kernel {ours * 1e3:.1f} us "
        f"({kv_bytes / ours / 1e9:.2f} TB/s of KV, {flops / ours / 1e9:.1f} TFLOP/s), "
        f"reference {ref * 1e3:.1f} us"
    )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_real_size_ragged_batch(dtype):
    rows = [(4000, 1), (4095, 1), (3000, 1), (4090, 1), (1000, 256), (0, 200), (33, 40)]
    check(make_step(rows, SHAPE), dtype, KV_LORA_RANK, None, interpret=False)


@pytest.mark.parametrize("batch", [1, 8, 32, 64])
def test_decode_4k(batch):
    shape = StepShape(batch, batch, 128, LATENT_DIM, 16, 4096)
    step = make_step([(4095, 1)] * batch, shape)
    check(step, jnp.bfloat16, KV_LORA_RANK, None, interpret=False)
    num_keys = batch * 4096
    _timed(step, jnp.bfloat16, f"decode B={batch} x 4k", num_keys * LATENT_DIM * 2, num_keys * 128 * 2 * 1088)


def test_prefill_chunk_4k():
    """A 2k-token chunk over a 2k cached prefix."""
    shape = StepShape(2048, 1, 128, LATENT_DIM, 16, 4096)
    step = make_step([(2048, 2048)], shape)
    check(step, jnp.bfloat16, KV_LORA_RANK, None, interpret=False)
    num_scores = 2048 * (2048 + 1024)  # causal: query i sees 2048 + i + 1 keys
    _timed(step, jnp.bfloat16, "prefill 2k over 2k", 4096 * LATENT_DIM * 2, num_scores * 128 * 2 * 1088)
