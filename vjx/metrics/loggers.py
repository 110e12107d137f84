"""PrometheusStatLogger: vLLM's Prometheus metrics, in a registry of their own.

Names, types, label names and buckets are vLLM's (`<prefix>:name`, labels `model_name` and
`engine`), so dashboards and autoscalers built for vLLM read vjx unchanged once the prefix is
`vllm`. Every metric lives in the logger's own `CollectorRegistry`, so several servers or
offline engines can share a process. A data-parallel engine reports as one (`engine="0"`):
its replicas' scheduler stats come merged.
"""

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vjx.config import CacheConfig
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.messages import FinishReason
from vjx.metrics import buckets
from vjx.metrics.stats import IterationStats

METRICS_PREFIXES = ("vjx", "vllm")
_LABEL_NAMES = ["model_name", "engine"]
_PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
_CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
"""vLLM's cache tiers; vjx's prefix cache is the device's only."""
_WAITING_REASONS = ("capacity", "deferred")
_SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
"""Why the front end refused a request at admission (vLLM's labels; vjx's server has the first)."""

_COUNTERS = {
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "generation_tokens": "Number of generation tokens processed.",
}
_SPEC_DECODE_COUNTERS = {
    "num_drafts": "Number of spec decoding drafts.",
    "num_draft_tokens": "Number of draft tokens.",
    "num_accepted_tokens": "Number of accepted tokens.",
}
# name: (documentation, bucket family); "request_tokens" buckets run up to max_model_len.
_HISTOGRAMS = {
    "request_prompt_tokens": ("Number of prefill tokens processed.", "request_tokens"),
    "request_generation_tokens": ("Number of generation tokens processed.", "request_tokens"),
    "iteration_tokens_total": ("Histogram of number of tokens per engine_step.", buckets.ITERATION_TOKENS_BUCKETS),
    "request_max_num_generation_tokens": (
        "Histogram of maximum number of requested generation tokens.",
        "request_tokens",
    ),
    "request_params_n": ("Histogram of the n request parameter.", buckets.REQUEST_PARAMS_N_BUCKETS),
    "request_params_max_tokens": ("Histogram of the max_tokens request parameter.", "request_tokens"),
    "time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.",
        buckets.TIME_TO_FIRST_TOKEN_BUCKETS,
    ),
    "inter_token_latency_seconds": (
        "Histogram of inter-token latency in seconds.",
        buckets.INTER_TOKEN_LATENCY_BUCKETS,
    ),
    "request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request.",
        buckets.INTER_TOKEN_LATENCY_BUCKETS,
    ),
    "e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", buckets.REQUEST_LATENCY_BUCKETS),
    "request_queue_time_seconds": (
        "Histogram of time spent in WAITING phase for request.",
        buckets.REQUEST_LATENCY_BUCKETS,
    ),
    "request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.",
        buckets.REQUEST_LATENCY_BUCKETS,
    ),
    "request_prefill_time_seconds": (
        "Histogram of time spent in PREFILL phase for request.",
        buckets.REQUEST_LATENCY_BUCKETS,
    ),
    "request_decode_time_seconds": (
        "Histogram of time spent in DECODE phase for request.",
        buckets.REQUEST_LATENCY_BUCKETS,
    ),
    "request_num_preemptions": (
        "Histogram of the number of times a request was preempted.",
        buckets.REQUEST_NUM_PREEMPTIONS_BUCKETS,
    ),
    "request_prefill_kv_computed_tokens": (
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "request_tokens",
    ),
}


class PrometheusStatLogger:
    """Records `SchedulerStats` (gauges now, counts since the last ask) and `IterationStats`."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        prefix: str = "vjx",
        engine_index: int = 0,
        num_speculative_tokens: int = 0,
    ):
        """`num_speculative_tokens` > 0 (speculative decoding on) adds vLLM's spec_decode counters."""
        if prefix not in METRICS_PREFIXES:
            raise ValueError(f"metrics prefix must be one of {METRICS_PREFIXES}, got {prefix!r}.")
        self.prefix = prefix + ":"
        self.registry = CollectorRegistry()
        self.label_values = {"model_name": model_name, "engine": str(engine_index)}
        self._request_tokens_buckets = buckets.request_tokens_buckets(max_model_len)
        self._make_scheduler_gauges()
        self.counters = {name: self._labelled(Counter, name, doc) for name, doc in _COUNTERS.items()}
        self.histograms = {name: self._make_histogram(name, *spec) for name, spec in _HISTOGRAMS.items()}
        self.spec_decode_counters = {}
        if num_speculative_tokens:
            self._make_spec_decode_counters(num_speculative_tokens)
        by_source = self._family(Counter, "prompt_tokens_by_source", "Number of prompt tokens by source.", "source")
        self.prompt_tokens_by_source = {
            s: by_source.labels(**self.label_values, source=s) for s in _PROMPT_TOKEN_SOURCES
        }
        cached_by_source = self._family(
            Counter,
            "prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded "
            "to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            f"admission; sums to {self.prefix}prefix_cache_hits + {self.prefix}external_prefix_cache_hits.",
            "source",
        )
        self.cached_by_source = {s: cached_by_source.labels(**self.label_values, source=s) for s in _CACHE_HIT_SOURCES}
        success = self._family(
            Counter, "request_success", "Count of successfully processed requests.", "finished_reason"
        )
        self.request_success = {r: success.labels(**self.label_values, finished_reason=str(r)) for r in FinishReason}
        rejections = Counter(
            self.prefix + "admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=self.registry,
        )
        self.admission_rejections = {r: rejections.labels(model_name=model_name, reason=r) for r in ADMISSION_REASONS}

    def _family(self, kind, name: str, documentation: str, *extra_labels: str, **kwargs):
        return kind(
            self.prefix + name, documentation, _LABEL_NAMES + list(extra_labels), registry=self.registry, **kwargs
        )

    def _labelled(self, kind, name: str, documentation: str, **kwargs):
        return self._family(kind, name, documentation, **kwargs).labels(**self.label_values)

    def _make_histogram(self, name: str, documentation: str, family) -> Histogram:
        bounds = self._request_tokens_buckets if family == "request_tokens" else family
        return self._labelled(Histogram, name, documentation, buckets=bounds)

    def _make_spec_decode_counters(self, num_speculative_tokens: int) -> None:
        """vLLM's spec_decode counters, only when speculative decoding is on (as vLLM)."""
        self.spec_decode_counters = {
            name: self._labelled(Counter, "spec_decode_" + name, doc) for name, doc in _SPEC_DECODE_COUNTERS.items()
        }
        per_pos = self._family(
            Counter, "spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", "position"
        )
        self.accepted_per_pos = [
            per_pos.labels(**self.label_values, position=str(p)) for p in range(num_speculative_tokens)
        ]

    def _make_scheduler_gauges(self) -> None:
        self.num_requests_running = self._labelled(
            Gauge, "num_requests_running", "Number of requests in model execution batches."
        )
        self.num_requests_waiting = self._labelled(
            Gauge, "num_requests_waiting", "Number of requests waiting to be processed."
        )
        by_reason = self._family(
            Gauge,
            "num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            f"Sum of all reasons equals {self.prefix}num_requests_waiting.",
            "reason",
        )
        self.waiting_by_reason = {r: by_reason.labels(**self.label_values, reason=r) for r in _WAITING_REASONS}
        sleep = self._family(
            Gauge,
            "engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "sleep_state",
        )
        self.sleep_states = {state: sleep.labels(**self.label_values, sleep_state=state) for state in _SLEEP_STATES}
        self.record_sleep_state(None)
        self.kv_cache_usage = self._labelled(Gauge, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.utilization = {
            name: self._labelled(Gauge, name, f"Model {kind} utilization of the engine's steps (NaN: peak unknown).")
            for name, kind in (("mbu", "bandwidth"), ("mfu", "FLOP"))
        }

    def log_cache_config(self, cache_config: CacheConfig, num_gpu_blocks: int) -> None:
        """vLLM's `cache_config_info`: a gauge set to 1 whose labels are the cache config."""
        info = {name: str(value) for name, value in vars(cache_config).items()}
        info["num_gpu_blocks"] = str(num_gpu_blocks)
        info["engine"] = self.label_values["engine"]
        gauge = Gauge(
            self.prefix + "cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=self.registry,
        )
        gauge.labels(**info).set(1)

    def record_admission_rejection(self, reason: str) -> None:
        """One request refused by the front end's queue limit `reason` (ADMISSION_REASONS)."""
        self.admission_rejections[reason].inc()

    def record_scheduler_stats(self, stats: SchedulerStats) -> None:
        self.num_requests_running.set(stats.num_running_reqs)
        self.num_requests_waiting.set(stats.num_waiting_reqs)
        self.waiting_by_reason["capacity"].set(stats.num_waiting_reqs)
        self.waiting_by_reason["deferred"].set(0)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        for name, gauge in self.utilization.items():
            value = getattr(stats, name)
            gauge.set(math.nan if value is None else value)
        self.counters["prefix_cache_queries"].inc(stats.num_prefix_queried_tokens)
        self.counters["prefix_cache_hits"].inc(stats.num_prefix_hit_tokens)
        self.cached_by_source["device"].inc(stats.num_prefix_hit_tokens)
        self.record_sleep_state(stats.sleep_level)
        if self.spec_decode_counters:
            spec = stats.spec_decoding_stats
            for name, counter in self.spec_decode_counters.items():
                counter.inc(getattr(spec, name))
            for counter, accepted in zip(self.accepted_per_pos, spec.num_accepted_tokens_per_pos):
                counter.inc(accepted)

    def record_sleep_state(self, level: int | None) -> None:
        """vLLM's sleep gauges: awake, or asleep with level 1 (weights offloaded) or 2 (all discarded)."""
        self.sleep_states["awake"].set(level is None)
        self.sleep_states["weights_offloaded"].set(level == 1)
        self.sleep_states["discard_all"].set(level == 2)

    def record_iteration_stats(self, stats: IterationStats) -> None:
        counters, histograms = self.counters, self.histograms
        prompt = stats.prompt_token_stats
        counters["num_preemptions"].inc(stats.num_preempted_reqs)
        counters["prompt_tokens"].inc(prompt.total)
        counters["prompt_tokens_cached"].inc(prompt.local_cache_hit)
        counters["generation_tokens"].inc(stats.num_generation_tokens)
        self.prompt_tokens_by_source["local_compute"].inc(prompt.computed)
        self.prompt_tokens_by_source["local_cache_hit"].inc(prompt.local_cache_hit)
        histograms["iteration_tokens_total"].observe(prompt.computed + stats.num_generation_tokens)
        for value in stats.max_num_generation_tokens_iter:
            histograms["request_max_num_generation_tokens"].observe(value)
        for value in stats.n_params_iter:
            histograms["request_params_n"].observe(value)
        for value in stats.time_to_first_tokens_iter:
            histograms["time_to_first_token_seconds"].observe(value)
        for value in stats.inter_token_latencies_iter:
            histograms["inter_token_latency_seconds"].observe(value)
        for finished in stats.finished_requests:
            self._record_finished(finished)

    def _record_finished(self, finished) -> None:
        self.request_success[finished.finish_reason].inc()
        observed = {
            "e2e_request_latency_seconds": finished.e2e_latency,
            "request_queue_time_seconds": finished.queued_time,
            "request_prefill_time_seconds": finished.prefill_time,
            "request_inference_time_seconds": finished.inference_time,
            "request_decode_time_seconds": finished.decode_time,
            "request_num_preemptions": finished.num_preemptions,
            "request_prefill_kv_computed_tokens": finished.num_prompt_tokens - finished.num_cached_tokens,
            "request_prompt_tokens": finished.num_prompt_tokens,
            "request_generation_tokens": finished.num_generation_tokens,
            "request_time_per_output_token_seconds": finished.mean_time_per_output_token,
        }
        for name, value in observed.items():
            self.histograms[name].observe(value)
        if finished.max_tokens_param:
            self.histograms["request_params_max_tokens"].observe(finished.max_tokens_param)
