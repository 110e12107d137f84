"""vLLM 0.32's engine arguments, every one, as data: how vjx takes each of them.

`EngineArgs` accepts every field of vLLM's `EngineArgs` (and `AsyncEngineArgs`) by name, in
Python and as a `vjx serve` flag. Each row says what vjx does with it:

- VJX: vjx implements it; `EngineArgs` declares it as a field of its own, documented there.
- SERVER: a `vjx serve` flag (`ServerArgs`); the engine does not read it.
- NO_EFFECT: it has no meaning on JAX/XLA; a value other than vLLM's default logs one info line.
- UNSUPPORTED: not built yet; a value other than vLLM's default raises ValueError naming it.

The default is vLLM's (None where vLLM's is a config object); the flag is how the command line
parses it, as vLLM's does (see `vjx.utils.argparse_utils.flag_kwargs`); None: vLLM has no flag.
"""

import copy
import dataclasses
import logging
import typing

logger = logging.getLogger(__name__)

VJX, SERVER, NO_EFFECT, UNSUPPORTED = "vjx", "server", "no effect", "unsupported"


class VllmArg(typing.NamedTuple):
    name: str
    default: typing.Any
    flag: str | None
    kind: str
    reason: str


_SERVER = "a `vjx serve` flag: the HTTP server reads it, the engine does not"
_COMPILE = "XLA compiles every step shape ahead of time (no torch.compile, CUDA graphs or eager mode)"
_KERNELS = "vjx runs its own XLA and Pallas kernels (no CUDA kernel choices)"
_COLLECTIVES = "XLA runs the collectives (no NCCL or torch.distributed process group)"
_LOADER = "vjx's loader reads each safetensors tensor straight into its device sharding"
_NO_REMOTE_CODE = "vjx runs only its built-in architectures, so no remote code is loaded"
_TEXT_ONLY = "vjx loads text-only language models, so no media is read"
_MM = "multimodal inputs are not built yet"
_LORA = "this LoRA option is not built yet (vjx serves PEFT adapters on q/k/v/o and gate/up/down projections)"
_EP = "vjx runs expert parallelism as enable_expert_parallel (local experts, then an all-reduce); this is not built"
_DBO = "dual-batch overlap is not built yet"
_MULTI_NODE = "data-parallel replicas launched from outside (external or hybrid load balancing) are not built yet"
_API_SERVERS = "several API server processes are not built yet"
_CONTEXT_PARALLEL = "context parallelism is not built yet"
_OFFLOAD = "weight and KV offloading are not built yet"
_MAMBA = (
    "this state-space option is not built yet (vjx keeps Mamba2 states in the model dtype, without the align mode);"
    " linear-attention models are not built yet"
)
_QUANT = "vjx reads a quantized checkpoint's own quantization_config; an override is not built"
_KV_SKIP = "every layer's KV cache takes kv_cache_dtype; keeping some layers unquantized is not built"
_QUANT_OFF = "vjx builds none of the quantization methods vLLM deprecates, so there is none to allow"
_POOLING = "pooling models are not built yet"
_KV_TRANSFER = "KV transfer, KV events and weight transfer are not built yet"
_SLEEP = "sleep mode is not built yet"
_TRACING = "tracing and the torch profiler are not built yet (vjx has profile_host)"
_METRICS = "these metrics are not built yet"
_STRUCTURED = "structured outputs run on llguidance with vLLM's defaults; this option is not built yet"
_PLUGINS = "plugin classes (scheduler, worker, logits processors, platform config) are not built yet"
_FAULT = "fault tolerance is not built yet"
_NO_VLLM_ENV = "vjx reads no VLLM_* environment variables"
_SHM = "vjx sends step inputs over ZeroMQ as msgspec structs (no shared-memory tensor arena)"
_NO_DP_SYNC = "vjx's data-parallel replicas never synchronize their steps"

VLLM_ARGS: tuple[VllmArg, ...] = tuple(
    VllmArg(*row)
    for row in (
        # name, vLLM's default, flag, kind, reason
        ("model", "Qwen/Qwen3-0.6B", "str", VJX, ""),
        ("enable_return_routed_experts", False, "bool", UNSUPPORTED, _EP),
        ("return_sampling_mask", False, "bool", UNSUPPORTED, "returning the sampling mask is not built yet"),
        ("model_weights", "", None, UNSUPPORTED, "weights from a path other than the model's are not built yet"),
        ("served_model_name", None, "strs", SERVER, _SERVER),
        ("tokenizer", None, "str", VJX, ""),
        ("hf_config_path", None, "str", UNSUPPORTED, "vjx reads the config.json of the model directory"),
        ("runner", "auto", "str", UNSUPPORTED, "vjx runs generative models only; 'generate' is what it does"),
        ("convert", "auto", "str", UNSUPPORTED, "converting a model for pooling is not built yet"),
        ("skip_tokenizer_init", False, "bool", UNSUPPORTED, "vjx always loads the tokenizer"),
        ("enable_prompt_embeds", False, "bool", UNSUPPORTED, _MM),
        ("tokenizer_mode", "auto", "str", UNSUPPORTED, "vjx loads Hugging Face tokenizers only ('hf' is what it does)"),
        ("trust_remote_code", False, "bool", NO_EFFECT, _NO_REMOTE_CODE),
        ("allowed_local_media_path", "", "str", NO_EFFECT, _TEXT_ONLY),
        ("allowed_media_domains", None, "strs", NO_EFFECT, _TEXT_ONLY),
        ("download_dir", None, "str", VJX, ""),
        ("safetensors_load_strategy", None, "str", NO_EFFECT, _LOADER),
        ("safetensors_prefetch_num_threads", 8, "int", NO_EFFECT, _LOADER),
        ("safetensors_prefetch_block_size", 16777216, "hint", NO_EFFECT, _LOADER),
        ("load_format", "auto", "str", VJX, ""),
        ("config_format", "auto", "str", UNSUPPORTED, "vjx reads Hugging Face config.json only ('hf' is what it does)"),
        ("dtype", "auto", "str", VJX, ""),
        ("kv_cache_dtype", "auto", "str", VJX, ""),
        ("seed", 0, "int", VJX, ""),
        ("max_model_len", None, "hint_auto", VJX, ""),
        ("cudagraph_capture_sizes", None, "ints", NO_EFFECT, _COMPILE),
        ("max_cudagraph_capture_size", None, "int", NO_EFFECT, _COMPILE),
        ("ir_op_priority", None, "json", NO_EFFECT, _KERNELS),
        ("distributed_executor_backend", None, "str", VJX, ""),
        ("pipeline_parallel_size", 1, "int", VJX, ""),
        ("master_addr", "127.0.0.1", "str", VJX, ""),
        ("master_port", 29501, "int", VJX, ""),
        ("nnodes", 1, "int", VJX, ""),
        ("node_rank", 0, "int", VJX, ""),
        ("distributed_timeout_seconds", None, "int", NO_EFFECT, _COLLECTIVES),
        ("cpu_distributed_timeout_seconds", None, "int", NO_EFFECT, _COLLECTIVES),
        ("numa_bind", False, "bool", UNSUPPORTED, "NUMA binding is not built yet"),
        ("numa_bind_nodes", None, "strs", UNSUPPORTED, "NUMA binding is not built yet"),
        ("numa_bind_cpus", None, "strs", UNSUPPORTED, "NUMA binding is not built yet"),
        (
            "device_ids",
            None,
            "str",
            UNSUPPORTED,
            "vjx uses every visible device; choose them with CUDA_VISIBLE_DEVICES",
        ),
        ("tensor_parallel_size", 1, "int", VJX, ""),
        ("prefill_context_parallel_size", 1, "int", UNSUPPORTED, _CONTEXT_PARALLEL),
        ("decode_context_parallel_size", 1, "int", UNSUPPORTED, _CONTEXT_PARALLEL),
        ("dcp_comm_backend", None, "str", UNSUPPORTED, _CONTEXT_PARALLEL),
        ("dcp_q_replicate", None, "bool", UNSUPPORTED, _CONTEXT_PARALLEL),
        ("dcp_kv_cache_interleave_size", 1, "int", UNSUPPORTED, _CONTEXT_PARALLEL),
        ("cp_kv_cache_interleave_size", None, "int", UNSUPPORTED, _CONTEXT_PARALLEL),
        ("data_parallel_size", 1, "int", VJX, ""),
        ("data_parallel_rank", None, "int", UNSUPPORTED, _MULTI_NODE),
        ("data_parallel_start_rank", None, "int", VJX, ""),
        ("data_parallel_size_local", None, "int", VJX, ""),
        ("data_parallel_address", None, "str", VJX, ""),
        ("data_parallel_rpc_port", None, "int", VJX, ""),
        ("data_parallel_hybrid_lb", False, "bool", UNSUPPORTED, _MULTI_NODE),
        ("data_parallel_external_lb", False, "bool", UNSUPPORTED, _MULTI_NODE),
        ("data_parallel_multi_port_external_lb", False, "bool", UNSUPPORTED, _MULTI_NODE),
        (
            "data_parallel_backend",
            "mp",
            "str",
            UNSUPPORTED,
            "vjx starts data-parallel replicas as its own processes ('mp'); Ray-launched replicas are not built yet",
        ),
        ("enable_hc_sp", False, "bool", UNSUPPORTED, _EP),
        ("enable_expert_parallel", False, "bool", VJX, ""),
        ("enable_batch_sharded_sampling", None, "bool", UNSUPPORTED, "batch-sharded sampling is not built yet"),
        ("enable_ep_weight_filter", False, "bool", UNSUPPORTED, _EP),
        ("moe_backend", "auto", "str", NO_EFFECT, _KERNELS),
        ("linear_backend", "auto", "str", NO_EFFECT, _KERNELS),
        ("sparse_indexer_topk_backend", "auto", "str", NO_EFFECT, _KERNELS),
        ("all2all_backend", "allgather_reducescatter", "str", UNSUPPORTED, _EP),
        ("enable_elastic_ep", False, "bool", UNSUPPORTED, _EP),
        ("elastic_ep_max_dp_size", None, "int", UNSUPPORTED, _EP),
        ("enable_dbo", False, "bool", UNSUPPORTED, _DBO),
        ("ubatch_size", 0, "int", UNSUPPORTED, _DBO),
        ("dbo_decode_token_threshold", 32, "int", UNSUPPORTED, _DBO),
        ("dp_sync_interval", 16, "int", NO_EFFECT, _NO_DP_SYNC),
        ("dbo_prefill_token_threshold", 512, "int", UNSUPPORTED, _DBO),
        ("disable_nccl_for_dp_synchronization", None, "bool", NO_EFFECT, _COLLECTIVES),
        ("eplb_config", None, "json", UNSUPPORTED, _EP),
        ("enable_eplb", False, "bool", UNSUPPORTED, _EP),
        ("expert_placement_strategy", "linear", "str", UNSUPPORTED, _EP),
        ("_api_process_count", 1, None, UNSUPPORTED, _API_SERVERS),
        ("_api_process_rank", 0, None, UNSUPPORTED, _API_SERVERS),
        ("max_parallel_loading_workers", None, "int", NO_EFFECT, _LOADER),
        ("block_size", None, "int", VJX, ""),
        ("enable_prefix_caching", None, "bool", VJX, ""),
        ("prefix_caching_hash_algo", "sha256", "str", VJX, ""),
        ("prefix_cache_retention_interval", 0, "int", UNSUPPORTED, "prefix-cache retention is not built yet"),
        ("disable_sliding_window", False, "bool", UNSUPPORTED, "sliding-window models always use their window in vjx"),
        ("disable_cascade_attn", None, "bool", NO_EFFECT, _KERNELS),
        ("offload_backend", "auto", "str", UNSUPPORTED, _OFFLOAD),
        ("cpu_offload_gb", 0, "float", UNSUPPORTED, _OFFLOAD),
        ("cpu_offload_params", [], "strs", UNSUPPORTED, _OFFLOAD),
        ("offload_group_size", 0, "int", UNSUPPORTED, _OFFLOAD),
        ("offload_num_in_group", 1, "int", UNSUPPORTED, _OFFLOAD),
        ("offload_prefetch_step", 1, "int", UNSUPPORTED, _OFFLOAD),
        ("offload_params", [], "strs", UNSUPPORTED, _OFFLOAD),
        ("gpu_memory_utilization", 0.92, "float", VJX, ""),
        ("kv_cache_memory_bytes", None, "int", VJX, ""),
        ("max_num_batched_tokens", None, "hint", VJX, ""),
        ("max_num_scheduled_tokens", None, "int", UNSUPPORTED, "a cap besides max_num_batched_tokens is not built"),
        ("long_prefill_token_threshold", 0, "int", VJX, ""),
        ("long_prefill_token_threshold_adaptive", False, "bool", UNSUPPORTED, "adaptive thresholds are not built yet"),
        ("max_num_seqs", None, "int", VJX, ""),
        (
            "max_num_active_seqs",
            None,
            "int",
            UNSUPPORTED,
            "an active-request cap other than max_num_seqs is not built yet",
        ),
        ("max_num_queued_reqs", None, "int", SERVER, _SERVER),
        ("max_num_queued_tokens", None, "int", UNSUPPORTED, "a queued-token cap is not built yet"),
        ("max_logprobs", 20, "int", VJX, ""),
        (
            "logprobs_mode",
            "raw_logprobs",
            "str",
            UNSUPPORTED,
            "vjx returns the model's raw logprobs ('raw_logprobs') only",
        ),
        ("use_fp64_gumbel", False, "bool", UNSUPPORTED, "float64 Gumbel sampling is not built yet"),
        ("enable_trace_replay", False, "bool", UNSUPPORTED, "trace replay is not built yet"),
        ("disable_log_stats", False, "bool", VJX, ""),
        ("aggregate_engine_logging", False, "bool", UNSUPPORTED, _METRICS),
        ("revision", None, "str", VJX, ""),
        ("code_revision", None, "str", NO_EFFECT, _NO_REMOTE_CODE),
        ("hf_token", None, "token", UNSUPPORTED, "vjx reads the token of `hf auth login` or HF_TOKEN"),
        ("hf_overrides", {}, "json_or_str", UNSUPPORTED, "overriding the Hugging Face config is not built yet"),
        ("model_class_overrides", {}, "json", UNSUPPORTED, _PLUGINS),
        ("tokenizer_revision", None, "str", VJX, ""),
        ("quantization", None, "str", VJX, ""),
        ("quantization_config", None, "json", UNSUPPORTED, _QUANT),
        ("allow_deprecated_quantization", False, "bool", NO_EFFECT, _QUANT_OFF),
        ("enforce_eager", False, "bool", NO_EFFECT, _COMPILE),
        ("disable_custom_all_reduce", False, "bool", NO_EFFECT, _COLLECTIVES),
        ("enable_shm_tensor_arena", False, "bool", NO_EFFECT, _SHM),
        ("language_model_only", False, "bool", NO_EFFECT, _TEXT_ONLY),
        ("limit_mm_per_prompt", {}, "json", UNSUPPORTED, _MM),
        ("enable_mm_embeds", False, "bool", UNSUPPORTED, _MM),
        ("interleave_mm_strings", False, "bool", UNSUPPORTED, _MM),
        ("media_io_kwargs", {}, "json", UNSUPPORTED, _MM),
        ("mm_processor_kwargs", None, "json", UNSUPPORTED, _MM),
        ("mm_processor_cache_gb", 4, "float", UNSUPPORTED, _MM),
        ("mm_processor_cache_type", "lru", "str", UNSUPPORTED, _MM),
        ("mm_hasher_algorithm", "blake3", "str", UNSUPPORTED, _MM),
        ("mm_shm_cache_max_object_size_mb", 128, "int", UNSUPPORTED, _MM),
        ("mm_encoder_only", False, "bool", UNSUPPORTED, _MM),
        ("mm_encoder_tp_mode", "weights", "str", UNSUPPORTED, _MM),
        ("mm_encoder_attn_backend", None, "str", UNSUPPORTED, _MM),
        ("mm_encoder_attn_dtype", None, "str", UNSUPPORTED, _MM),
        ("mm_encoder_fp8_scale_path", None, "str", UNSUPPORTED, _MM),
        ("mm_encoder_fp8_scale_save_path", None, "str", UNSUPPORTED, _MM),
        ("mm_encoder_fp8_scale_save_margin", 1.5, "float", UNSUPPORTED, _MM),
        ("io_processor_plugin", None, "str", UNSUPPORTED, _MM),
        ("renderer_num_workers", 1, "int", UNSUPPORTED, "a renderer worker pool is not built yet"),
        ("skip_mm_profiling", False, "bool", UNSUPPORTED, _MM),
        ("video_pruning_rate", None, "float", UNSUPPORTED, _MM),
        ("video_pruning_method", "evs", "str", UNSUPPORTED, _MM),
        ("mm_tensor_ipc", "direct_rpc", "str", UNSUPPORTED, _MM),
        ("mm_processor_device", "auto", "str", UNSUPPORTED, _MM),
        ("mm_ipc_gpu_memory_gb", 0, "float", UNSUPPORTED, _MM),
        ("mm_device_do_normalize", True, "bool", UNSUPPORTED, _MM),
        ("enable_lora", False, "bool", VJX, ""),
        ("max_loras", 1, "int", VJX, ""),
        ("max_lora_rank", 16, "int", VJX, ""),
        ("default_mm_loras", None, "json", UNSUPPORTED, _LORA),
        ("fully_sharded_loras", False, "bool", UNSUPPORTED, _LORA),
        ("max_cpu_loras", None, "int", VJX, ""),
        ("lora_dtype", "auto", "str", UNSUPPORTED, _LORA),
        ("lora_target_modules", None, "strs", UNSUPPORTED, _LORA),
        ("enable_tower_connector_lora", False, "bool", UNSUPPORTED, _LORA),
        ("specialize_active_lora", False, "bool", UNSUPPORTED, _LORA),
        ("enable_mixed_moe_lora_format", False, "bool", UNSUPPORTED, _LORA),
        ("enable_moe_shared_loras", False, "bool", UNSUPPORTED, _LORA),
        ("max_lora_cls_labels", None, "int", UNSUPPORTED, _LORA),
        ("ray_workers_use_nsight", False, "bool", UNSUPPORTED, "Nsight profiling of Ray workers is not built yet"),
        ("num_gpu_blocks_override", None, "int", VJX, ""),
        ("model_loader_extra_config", {}, "json_or_str", UNSUPPORTED, "loader options are not built yet"),
        ("ignore_patterns", ["original/**/*"], "strs", UNSUPPORTED, "vjx downloads its own file set"),
        ("enable_chunked_prefill", None, "bool", VJX, ""),
        ("disable_chunked_mm_input", False, "bool", UNSUPPORTED, _MM),
        ("scheduler_reserve_full_isl", True, "bool", UNSUPPORTED, "full-prompt reservation is not built yet"),
        ("prefill_schedule_interval", 1, "int", UNSUPPORTED, "a prefill interval is not built yet"),
        ("watermark", 0.0, "float", UNSUPPORTED, "a free-block watermark is not built yet"),
        ("disable_hybrid_kv_cache_manager", None, "bool", UNSUPPORTED, "vjx always groups layers by KV spec"),
        ("structured_outputs_config", None, "json", UNSUPPORTED, _STRUCTURED),
        ("aux_output_config", None, "json", UNSUPPORTED, "auxiliary outputs are not built yet"),
        ("reasoning_parser", "", "str", VJX, ""),
        ("reasoning_parser_plugin", None, "str", UNSUPPORTED, _STRUCTURED),
        ("speculative_config", None, "json", VJX, ""),
        ("spec_method", None, "str", VJX, ""),
        ("spec_model", None, "str", VJX, ""),
        ("spec_tokens", None, "int", VJX, ""),
        ("watermark_config", None, "json", UNSUPPORTED, "output watermarking is not built yet"),
        ("diffusion_config", None, "json", UNSUPPORTED, "diffusion models are not built yet"),
        ("show_hidden_metrics_for_version", None, "str", UNSUPPORTED, _METRICS),
        ("otlp_traces_endpoint", None, "str", UNSUPPORTED, _TRACING),
        ("collect_detailed_traces", None, "strs", UNSUPPORTED, _TRACING),
        ("per_request_spec_decode_metrics", "none", "str", VJX, ""),
        ("kv_cache_metrics", False, "bool", UNSUPPORTED, _METRICS),
        ("kv_cache_metrics_sample", 0.01, "float", UNSUPPORTED, _METRICS),
        ("custom_histogram_buckets", None, "json", UNSUPPORTED, _METRICS),
        ("cudagraph_metrics", False, "bool", NO_EFFECT, _COMPILE),
        ("enable_layerwise_nvtx_tracing", False, "bool", UNSUPPORTED, _TRACING),
        ("enable_mfu_metrics", False, "bool", UNSUPPORTED, _METRICS),
        ("enable_logging_iteration_details", False, "bool", UNSUPPORTED, _METRICS),
        ("jit_monitor_mode", "warn", "str", NO_EFFECT, _COMPILE),
        ("jit_monitor_verbose", False, "bool", NO_EFFECT, _COMPILE),
        ("enable_mm_processor_stats", False, None, UNSUPPORTED, _MM),
        ("scheduling_policy", "fcfs", "str", VJX, ""),
        ("scheduler_cls", None, "str", UNSUPPORTED, _PLUGINS),
        ("pooler_config", None, "json", UNSUPPORTED, _POOLING),
        ("compilation_config", None, "json", NO_EFFECT, _COMPILE),
        ("attention_config", None, "json", UNSUPPORTED, "not built yet (vjx has attention_backend)"),
        ("engram_config", None, "json", UNSUPPORTED, "Engram models are not built yet"),
        ("mamba_config", None, None, UNSUPPORTED, _MAMBA),
        ("kernel_config", None, "json", NO_EFFECT, _KERNELS),
        ("enable_flashinfer_autotune", None, "bool", NO_EFFECT, _KERNELS),
        ("worker_cls", "auto", "str", UNSUPPORTED, _PLUGINS),
        ("worker_extension_cls", "", "str", UNSUPPORTED, _PLUGINS),
        ("profiler_config", None, "json", UNSUPPORTED, _TRACING),
        (
            "logging_config",
            None,
            "json",
            UNSUPPORTED,
            "vjx's logging is configured by the command's flags (--log-level)",
        ),
        ("log_level", None, "str", SERVER, _SERVER),
        (
            "log_config_file",
            None,
            "str",
            UNSUPPORTED,
            "vjx's logging is configured by the command's flags (--log-level)",
        ),
        ("kv_transfer_config", None, "json", UNSUPPORTED, _KV_TRANSFER),
        ("kv_events_config", None, "json", UNSUPPORTED, _KV_TRANSFER),
        ("ec_transfer_config", None, "json", UNSUPPORTED, _MM),
        ("ec_manager_config", None, "json", UNSUPPORTED, _MM),
        ("reasoning_config", None, "json", UNSUPPORTED, _STRUCTURED),
        ("generation_config", "auto", "str", VJX, ""),
        ("enable_sleep_mode", False, "bool", UNSUPPORTED, _SLEEP),
        ("sleep_mode_offload_cudagraph", False, "bool", UNSUPPORTED, _SLEEP),
        ("sleep_preserve_parameter_names", [], "strs", UNSUPPORTED, _SLEEP),
        ("enable_cumem_allocator", False, "bool", UNSUPPORTED, _SLEEP),
        ("enable_nccl_comm_suspend", False, "bool", NO_EFFECT, _COLLECTIVES),
        ("override_generation_config", {}, "json", VJX, ""),
        ("model_impl", "auto", "str", UNSUPPORTED, "the Transformers backend is not built yet"),
        ("attention_backend", None, "str", VJX, ""),
        ("kv_cache_dtype_skip_layers", [], "strs", UNSUPPORTED, _KV_SKIP),
        ("mamba_cache_dtype", "auto", "str", UNSUPPORTED, _MAMBA),
        ("mamba_ssm_cache_dtype", "auto", "str", UNSUPPORTED, _MAMBA),
        ("mamba_block_size", None, "int", UNSUPPORTED, _MAMBA),
        ("prefix_match_unit", None, "int", UNSUPPORTED, _MAMBA),
        ("mamba_cache_mode", "none", "str", UNSUPPORTED, _MAMBA),
        ("enable_mamba_shared_prefix_checkpoint", False, "bool", UNSUPPORTED, _MAMBA),
        ("replayssm_buffer_len", 16, "int", UNSUPPORTED, _MAMBA),
        ("use_replayssm", False, "bool", UNSUPPORTED, _MAMBA),
        ("mamba_backend", "triton", "str", UNSUPPORTED, _MAMBA),
        ("mamba_ssu_algorithm", None, "str", UNSUPPORTED, _MAMBA),
        ("enable_mamba_cache_stochastic_rounding", False, "bool", UNSUPPORTED, _MAMBA),
        ("mamba_cache_philox_rounds", 0, "int", UNSUPPORTED, _MAMBA),
        ("additional_config", {}, "json_or_str", UNSUPPORTED, _PLUGINS),
        ("use_tqdm_on_load", True, "bool", NO_EFFECT, _LOADER),
        ("pt_load_map_location", "cpu", "json_or_str", NO_EFFECT, _LOADER),
        ("logits_processors", None, "strs", UNSUPPORTED, _PLUGINS),
        ("async_scheduling", None, "bool", VJX, ""),
        ("stream_interval", 1, "int", UNSUPPORTED, "vjx streams every token (a stream interval is not built yet)"),
        ("kv_sharing_fast_prefill", False, "bool", UNSUPPORTED, "cross-layer KV sharing is not built yet"),
        ("swa_bounded_replay", True, "bool", UNSUPPORTED, "bounded sliding-window replay is not built yet"),
        ("optimization_level", 2, "int", NO_EFFECT, _COMPILE),
        ("performance_mode", "balanced", "str", UNSUPPORTED, "performance modes are not built yet"),
        ("fault_tolerance_config", None, "json", UNSUPPORTED, _FAULT),
        ("enable_fault_tolerance", False, "bool", UNSUPPORTED, _FAULT),
        ("kv_offloading_size", None, "float", UNSUPPORTED, _OFFLOAD),
        ("kv_offloading_backend", "native", "str", UNSUPPORTED, _OFFLOAD),
        ("tokens_only", False, None, UNSUPPORTED, "token-only serving is not built yet"),
        ("shutdown_timeout", 0, "int", SERVER, _SERVER),
        ("weight_transfer_config", None, "json", UNSUPPORTED, _KV_TRANSFER),
        ("fail_on_environ_validation", False, "bool", NO_EFFECT, _NO_VLLM_ENV),
        ("gdn_prefill_backend", None, "str", UNSUPPORTED, _MAMBA),
        ("kda_prefill_backend", None, "str", UNSUPPORTED, _MAMBA),
        ("kda_decode_backend", None, "str", UNSUPPORTED, _MAMBA),
        ("enable_log_requests", False, "bool", UNSUPPORTED, "request logging is not built yet"),
    )
)

VLLM_ARG_BY_NAME = {arg.name: arg for arg in VLLM_ARGS}

FLAG_ALIASES = {
    "quantization": ("-q",),
    "pipeline_parallel_size": ("-pp",),
    "nnodes": ("-n",),
    "node_rank": ("-r",),
    "tensor_parallel_size": ("-tp",),
    "decode_context_parallel_size": ("-dcp",),
    "prefill_context_parallel_size": ("-pcp",),
    "data_parallel_size": ("-dp",),
    "data_parallel_rank": ("-dpn",),
    "data_parallel_start_rank": ("-dpr",),
    "data_parallel_size_local": ("-dpl",),
    "data_parallel_address": ("-dpa",),
    "data_parallel_rpc_port": ("-dpp",),
    "data_parallel_backend": ("-dpb",),
    "data_parallel_hybrid_lb": ("-dph",),
    "data_parallel_external_lb": ("-dpe",),
    "data_parallel_multi_port_external_lb": ("-dpm",),
    "enable_expert_parallel": ("-ep",),
    "gpu_memory_utilization": ("--device-memory-utilization",),
    "speculative_config": ("-sc",),
    "diffusion_config": ("-dc",),
    "compilation_config": ("-cc",),
    "attention_config": ("-ac",),
}
"""vLLM's other spellings of a flag (`-O3` is `--optimization-level 3`: FlexibleArgumentParser)."""

NO_EFFECT_VALUES = {
    "runner": ("generate",),
    "convert": ("none",),
    "tokenizer_mode": ("hf",),
    "config_format": ("hf",),
    "model_impl": ("vllm",),
    "skip_mm_profiling": (True,),
    "mm_processor_cache_gb": (0,),
}
"""Values of UNSUPPORTED arguments that ask for what vjx does anyway: logged, not refused."""


_HELP = {
    SERVER: "A `vjx serve` flag.",
    NO_EFFECT: "No effect in vjx: {reason}.",
    UNSUPPORTED: "Not supported by vjx: {reason}; only vLLM's default is accepted.",
}


def _compat_field(arg: VllmArg) -> tuple[str, type, dataclasses.Field]:
    metadata = {"help": _HELP[arg.kind].format(reason=arg.reason)}
    if isinstance(arg.default, (list, dict)):
        field = dataclasses.field(default_factory=lambda: copy.deepcopy(arg.default), metadata=metadata)
    else:
        field = dataclasses.field(default=arg.default, metadata=metadata)
    return arg.name, typing.Any, field


VllmCompatArgs = dataclasses.make_dataclass(
    "VllmCompatArgs", [_compat_field(arg) for arg in VLLM_ARGS if arg.kind != VJX], kw_only=True
)
VllmCompatArgs.__doc__ = """vLLM's engine arguments that vjx does not implement (SERVER, NO_EFFECT and
UNSUPPORTED rows), as keyword-only fields at vLLM's defaults: `EngineArgs` inherits them."""


def _is_empty(value) -> bool:
    return value is None or (isinstance(value, (dict, list, tuple, set, frozenset)) and not value)


def is_vllm_default(arg: VllmArg, value) -> bool:
    """Whether `value` is vLLM's default (None and empty containers all stand for "not set")."""
    return value == arg.default or (_is_empty(value) and _is_empty(arg.default))


def verify_vllm_args(args) -> None:
    """Refuses UNSUPPORTED arguments set away from vLLM's default (ValueError naming the first)
    and logs one info line for each NO_EFFECT or SERVER argument set away from it."""
    for arg in VLLM_ARGS:
        value = getattr(args, arg.name)
        if arg.kind == VJX or is_vllm_default(arg, value):
            continue
        if arg.kind == UNSUPPORTED and value not in NO_EFFECT_VALUES.get(arg.name, ()):
            raise ValueError(
                f"{arg.name}={value!r} is not supported by vjx: {arg.reason}; "
                f"leave it at vLLM's default ({arg.default!r})."
            )
        logger.info("%s=%r has no effect in vjx: %s.", arg.name, value, arg.reason)
