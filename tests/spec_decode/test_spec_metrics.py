"""vLLM's spec_decode counters: present only with speculative decoding on (as in vLLM), with
vLLM's names, labels and values from the scheduler's stats."""

import prometheus_client

from vjx.core.sched.stats import SchedulerStats, SpecDecodingStats
from vjx.metrics.loggers import PrometheusStatLogger


def _samples(stat_logger) -> dict:
    text = prometheus_client.generate_latest(stat_logger.registry).decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if "spec_decode" in line and not line.startswith("#")
    }


def test_spec_decode_counters_are_vllms():
    assert _samples(PrometheusStatLogger("tiny", 256, "vllm")) == {}
    stat_logger = PrometheusStatLogger("tiny", 256, "vllm", num_speculative_tokens=2)
    spec = SpecDecodingStats().observe_draft(2, 2).observe_draft(2, 0).observe_draft(1, 1)
    stat_logger.record_scheduler_stats(SchedulerStats(1, 0, 0.0, spec_decoding_stats=spec))
    labels = 'engine="0",model_name="tiny"'
    samples = _samples(stat_logger)
    assert samples[f"vllm:spec_decode_num_drafts_total{{{labels}}}"] == 3
    assert samples[f"vllm:spec_decode_num_draft_tokens_total{{{labels}}}"] == 5
    assert samples[f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}}"] == 3
    assert samples[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}}'] == 2
    assert samples[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="1"}}'] == 1
