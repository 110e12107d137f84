"""PrometheusStatLogger and the reader, without an engine: vLLM's table, recorded values."""

import prometheus_client
import pytest

from tests.helpers.vllm_metrics import check_against_vllm, families_by_name
from vjx.config import CacheConfig
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.messages import FinishReason
from vjx.metrics import reader
from vjx.metrics.loggers import PrometheusStatLogger
from vjx.metrics.stats import FinishedRequestStats, IterationStats, PromptTokenStats


def _logger(prefix: str) -> PrometheusStatLogger:
    stat_logger = PrometheusStatLogger("tiny", 256, prefix)
    stat_logger.log_cache_config(CacheConfig(16, 0.9, None, True), 24)
    return stat_logger


def _finished(**overrides) -> FinishedRequestStats:
    fields = dict(
        finish_reason=FinishReason.STOP,
        e2e_latency=1.2,
        num_prompt_tokens=7,
        num_cached_tokens=2,
        num_generation_tokens=3,
        num_preemptions=0,
        max_tokens_param=16,
        queued_time=0.1,
        prefill_time=0.2,
        decode_time=0.6,
        inference_time=0.8,
        mean_time_per_output_token=0.3,
    )
    return FinishedRequestStats(**(fields | overrides))


@pytest.mark.parametrize("prefix", ["vjx", "vllm"])
def test_names_types_labels_and_buckets_are_vllms(prefix):
    text = prometheus_client.generate_latest(_logger(prefix).registry).decode()
    check_against_vllm(families_by_name(text, prefix))


def test_a_bad_prefix_is_refused():
    with pytest.raises(ValueError, match="metrics prefix must be one of"):
        PrometheusStatLogger("tiny", 256, "vllm:")


def test_recorded_values_read_back_as_vllm_metric_objects():
    stat_logger = _logger("vllm")
    stat_logger.record_scheduler_stats(SchedulerStats(2, 1, 0.25, num_prefix_queried_tokens=9, num_prefix_hit_tokens=4))
    stats = IterationStats()
    stats.num_generation_tokens = 5
    stats.prompt_token_stats = PromptTokenStats(computed=5, local_cache_hit=2)
    stats.time_to_first_tokens_iter = [0.03]
    stats.finished_requests = [_finished(), _finished(finish_reason=FinishReason.LENGTH, num_preemptions=2)]
    stat_logger.record_iteration_stats(stats)
    metrics = reader.get_metrics_snapshot(stat_logger.registry, "vllm:")
    labels = {"model_name": "tiny", "engine": "0"}
    by_name = {(m.name, tuple(sorted(set(m.labels.items()) - set(labels.items())))): m for m in metrics}
    assert by_name["vllm:num_requests_running", ()] == reader.Gauge("vllm:num_requests_running", labels, 2.0)
    assert by_name["vllm:generation_tokens", ()] == reader.Counter("vllm:generation_tokens", labels, 5)
    assert by_name["vllm:prompt_tokens", ()].value == 7 and by_name["vllm:prompt_tokens_cached", ()].value == 2
    assert by_name["vllm:prefix_cache_hits", ()].value == 4
    assert by_name["vllm:request_success", (("finished_reason", "length"),)].value == 1
    assert by_name["vllm:request_success", (("finished_reason", "abort"),)].value == 0
    ttft = by_name["vllm:time_to_first_token_seconds", ()]
    assert isinstance(ttft, reader.Histogram) and (ttft.count, ttft.sum) == (1, 0.03)
    assert ttft.buckets["0.02"] == 0 and ttft.buckets["0.04"] == 1 and ttft.buckets["+Inf"] == 1
    iteration = by_name["vllm:iteration_tokens_total", ()]
    assert (iteration.count, iteration.sum) == (1, 10.0)
    preemptions = by_name["vllm:request_num_preemptions", ()]
    assert preemptions.buckets["1.0"] == 1 and preemptions.buckets["2.0"] == 2
    kv_computed = by_name["vllm:request_prefill_kv_computed_tokens", ()]
    assert (kv_computed.count, kv_computed.sum) == (2, 10.0)
    assert all(m.name.startswith("vllm:") for m in metrics)


@pytest.mark.parametrize(
    "level, states",
    [(None, (1, 0, 0)), (0, (0, 0, 0)), (1, (0, 1, 0)), (2, (0, 0, 1))],
)
def test_the_sleep_gauges_follow_the_engines_sleep_level(level, states):
    stat_logger = _logger("vllm")
    stat_logger.record_scheduler_stats(SchedulerStats(0, 0, 0.0, sleep_level=level))
    gauges = {
        m.labels["sleep_state"]: m.value
        for m in reader.get_metrics_snapshot(stat_logger.registry, "vllm:")
        if m.name == "vllm:engine_sleep_state"
    }
    assert (gauges["awake"], gauges["weights_offloaded"], gauges["discard_all"]) == states
