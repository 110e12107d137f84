"""Per-bucket XLA options: the CPU's decode buckets compile their dots without YNNPACK."""

import pytest

from vjx.worker.step_layout import YNN_FUSION_OFF, compiler_options, decode_buckets


@pytest.mark.parametrize("num_tokens", decode_buckets("cpu", 512))
def test_cpu_decode_buckets_turn_ynn_fusion_off(num_tokens):
    assert compiler_options("cpu", num_tokens) == YNN_FUSION_OFF


@pytest.mark.parametrize(("platform", "num_tokens"), [("cpu", 16), ("cpu", 512), ("gpu", 1), ("tpu", 8)])
def test_other_buckets_and_platforms_keep_xla_defaults(platform, num_tokens):
    assert compiler_options(platform, num_tokens) is None
