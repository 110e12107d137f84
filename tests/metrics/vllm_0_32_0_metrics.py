"""vLLM 0.32.0's Prometheus metrics (vllm/v1/metrics/loggers.py, PrometheusStatLogger), as test data.

CI has no vLLM, so its names, types, label names and bucket families are written out here,
read from its source. Names are without the `vllm:` prefix, as Prometheus families: a counter's
samples add `_total`. `labels` excludes nothing: they are the family's label names.
"""

ENGINE_LABELS = ("model_name", "engine")

# Bucket families (vllm/v1/metrics/buckets.py); "request_tokens" is the 1-2-5 series up to
# max_model_len, written out for the test server's max_model_len of 256.
BUCKETS = {
    "request_latency": (
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
    ),
    "time_to_first_token": (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ),
    "inter_token_latency": (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0,
    ),
    "iteration_tokens": (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    "request_params_n": (1, 2, 5, 10, 20),
    "request_num_preemptions": (1, 2, 3, 4, 5, 10, 20),
    "request_tokens_256": (1, 2, 5, 10, 20, 50, 100, 200),
}  # fmt: skip

# name: (type, label names, bucket family or None)
METRICS = {
    "num_requests_running": ("gauge", ENGINE_LABELS, None),
    "num_requests_waiting": ("gauge", ENGINE_LABELS, None),
    "num_requests_waiting_by_reason": ("gauge", ENGINE_LABELS + ("reason",), None),
    "num_requests_kv_fetch_by_stage": ("gauge", ENGINE_LABELS + ("stage",), None),
    "engine_sleep_state": ("gauge", ENGINE_LABELS + ("sleep_state",), None),
    "kv_cache_usage_perc": ("gauge", ENGINE_LABELS, None),
    "corrupted_requests": ("counter", ENGINE_LABELS, None),
    "watermark_requests": ("counter", ENGINE_LABELS + ("status",), None),
    "prefix_cache_queries": ("counter", ENGINE_LABELS, None),
    "prefix_cache_hits": ("counter", ENGINE_LABELS, None),
    "external_prefix_cache_queries": ("counter", ENGINE_LABELS, None),
    "external_prefix_cache_hits": ("counter", ENGINE_LABELS, None),
    "mm_cache_queries": ("counter", ENGINE_LABELS, None),
    "mm_cache_hits": ("counter", ENGINE_LABELS, None),
    "num_preemptions": ("counter", ENGINE_LABELS, None),
    "prompt_tokens": ("counter", ENGINE_LABELS, None),
    "prompt_tokens_by_source": ("counter", ENGINE_LABELS + ("source",), None),
    "prompt_tokens_cached": ("counter", ENGINE_LABELS, None),
    "prompt_tokens_cached_by_source": ("counter", ENGINE_LABELS + ("source",), None),
    "generation_tokens": ("counter", ENGINE_LABELS, None),
    "request_success": ("counter", ENGINE_LABELS + ("finished_reason",), None),
    "admission_rejections": ("counter", ("model_name", "reason"), None),
    "request_prompt_tokens": ("histogram", ENGINE_LABELS, "request_tokens_256"),
    "request_generation_tokens": ("histogram", ENGINE_LABELS, "request_tokens_256"),
    "iteration_tokens_total": ("histogram", ENGINE_LABELS, "iteration_tokens"),
    "request_max_num_generation_tokens": ("histogram", ENGINE_LABELS, "request_tokens_256"),
    "request_params_n": ("histogram", ENGINE_LABELS, "request_params_n"),
    "request_params_max_tokens": ("histogram", ENGINE_LABELS, "request_tokens_256"),
    "time_to_first_token_seconds": ("histogram", ENGINE_LABELS, "time_to_first_token"),
    "inter_token_latency_seconds": ("histogram", ENGINE_LABELS, "inter_token_latency"),
    "request_time_per_output_token_seconds": ("histogram", ENGINE_LABELS, "inter_token_latency"),
    "e2e_request_latency_seconds": ("histogram", ENGINE_LABELS, "request_latency"),
    "request_queue_time_seconds": ("histogram", ENGINE_LABELS, "request_latency"),
    "request_inference_time_seconds": ("histogram", ENGINE_LABELS, "request_latency"),
    "request_prefill_time_seconds": ("histogram", ENGINE_LABELS, "request_latency"),
    "request_decode_time_seconds": ("histogram", ENGINE_LABELS, "request_latency"),
    "request_num_preemptions": ("histogram", ENGINE_LABELS, "request_num_preemptions"),
    "request_prefill_kv_computed_tokens": ("histogram", ENGINE_LABELS, "request_tokens_256"),
    "kv_block_lifetime_seconds": ("histogram", ENGINE_LABELS, "kv_cache_residency"),
    "kv_block_idle_before_evict_seconds": ("histogram", ENGINE_LABELS, "kv_cache_residency"),
    "kv_block_reuse_gap_seconds": ("histogram", ENGINE_LABELS, "kv_cache_residency"),
    "lora_requests_info": ("gauge", ("max_lora", "waiting_lora_adapters", "running_lora_adapters"), None),
    # Labels: every CacheConfig field, and `engine` (checked apart: the configs differ).
    "cache_config_info": ("gauge", None, None),
}

NOT_IN_VJX = {
    "num_requests_kv_fetch_by_stage": "KV connector (disaggregated prefill)",
    "corrupted_requests": "VLLM_COMPUTE_NANS_IN_LOGITS only",
    "watermark_requests": "watermarking",
    "external_prefix_cache_queries": "KV connector",
    "external_prefix_cache_hits": "KV connector",
    "mm_cache_queries": "multi-modal inputs",
    "mm_cache_hits": "multi-modal inputs",
    "kv_block_lifetime_seconds": "--kv-cache-metrics",
    "kv_block_idle_before_evict_seconds": "--kv-cache-metrics",
    "kv_block_reuse_gap_seconds": "--kv-cache-metrics",
    "lora_requests_info": "LoRA",
}
"""vLLM's metrics vjx does not export, and the feature each needs."""
