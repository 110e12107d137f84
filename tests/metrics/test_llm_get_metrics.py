"""`LLM.get_metrics()`: vLLM's metrics of an offline engine, from its own registry.

The engine runs the tiny stand-in for the default model with tests/test_llm.py's small_llm
shapes and stats on: 24 KV blocks for 8 requests force preemptions. Peaks given for the CPU
(none is known) make it report MBU and MFU.
"""

import pytest

from tests.helpers.tiny_default_model import save_tiny_default_model
from tests.helpers.vllm_metrics import check_against_vllm, families_by_name
from vjx import LLM, SamplingParams
from vjx.engine.llm_engine import LLMEngine
from vjx.metrics.reader import Counter, Gauge, Histogram

PROMPTS = [f"Count to ten: {i}, {i + 1}," for i in range(8)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(
        model=save_tiny_default_model(tmp_path_factory.mktemp("tiny-default")),
        max_model_len=256,
        max_num_seqs=16,
        max_num_batched_tokens=32,
        num_gpu_blocks_override=24,
        disable_log_stats=False,
        peak_memory_bandwidth=1e10,
        peak_flops=1e12,
    )


def test_get_metrics_after_a_batch(llm):
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    metrics = {m.name: m for m in llm.get_metrics() if m.labels.get("finished_reason", "length") == "length"}
    num_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    assert metrics["vjx:generation_tokens"] == Counter(
        "vjx:generation_tokens", metrics["vjx:generation_tokens"].labels, 320
    )
    assert metrics["vjx:prompt_tokens"].value == num_prompt
    assert metrics["vjx:request_success"].value == 8
    assert isinstance(metrics["vjx:num_requests_running"], Gauge) and metrics["vjx:num_requests_running"].value == 0
    assert metrics["vjx:num_preemptions"].value > 0
    e2e = metrics["vjx:e2e_request_latency_seconds"]
    assert isinstance(e2e, Histogram) and e2e.count == 8 and e2e.buckets["+Inf"] == 8
    assert metrics["vjx:request_num_preemptions"].sum == metrics["vjx:num_preemptions"].value
    assert metrics["vjx:request_generation_tokens"].sum == 320
    assert metrics["vjx:inter_token_latency_seconds"].count == 8 * 39
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds"):
        histogram = metrics["vjx:" + name]
        assert histogram.count == 8 and histogram.sum >= 0, name
    assert metrics["vjx:request_params_n"].buckets["1.0"] == 8
    assert all(m.labels.get("model_name") or m.name == "vjx:cache_config_info" for m in metrics.values())
    assert 0 < metrics["vjx:mbu"].value < 1 and 0 < metrics["vjx:mfu"].value < 1


def test_the_registry_is_vllms_table(llm):
    import prometheus_client

    registry = llm.llm_engine.stat_logger.registry
    check_against_vllm(families_by_name(prometheus_client.generate_latest(registry).decode(), "vjx"))


def test_get_metrics_needs_log_stats():
    engine = LLMEngine.__new__(LLMEngine)
    engine.stat_logger = None
    with pytest.raises(ValueError, match="disable_log_stats=False"):
        engine.get_metrics()
