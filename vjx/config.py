"""Frozen engine configuration, documented field by field.

`EngineArgs` (engine_args.py) validates user arguments and builds a `VjxConfig`; every other
part reads it and never mutates it. Runtime facts (the number of KV blocks, the buckets) are
returned by the part that measures them and passed on, not written back here.
"""

import dataclasses
from typing import Any

from vjx.lora.config import LoRAConfig
from vjx.models import generation_config as gen_config

CPU_MAX_NUM_BATCHED_TOKENS = 512
"""The CPU's default token budget: CPU compiles are slow (2 cores in CI), and a small budget
keeps the bucket set small. The CPU's serving paths (decode buckets, the blocked attention
backend) start at it; below it (a test's engine, a toy one) their compile time costs more than
they save."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What model runs and how its weights are read."""

    model: str
    """Path of a Hugging Face model directory (config.json, *.safetensors, tokenizer files):
    the user's, or a Hub model's snapshot in the hub cache."""
    tokenizer: str
    """Path of the tokenizer directory; the model directory unless given."""
    hf_config: Any
    """The `transformers.PretrainedConfig` read from the model directory."""
    dtype: str
    """Activation and weight dtype: "float32", "bfloat16" or "float16"."""
    max_model_len: int
    """Most tokens (prompt + output) one request may hold."""
    seed: int
    """Seed for dummy weights and for requests that give no seed of their own."""
    load_format: str
    """"auto" (safetensors), "safetensors" or "dummy" (random weights of the real shapes)."""
    max_logprobs: int = 20
    """Most `logprobs` / `prompt_logprobs` a request may ask for (the step returns this many)."""
    generation_config: str = "auto"
    """Where default sampling parameters come from: "auto" (the model directory's
    generation_config.json), "vllm" (nowhere: vLLM's defaults) or a directory holding a
    generation_config.json."""
    override_generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Generation-config fields set on top of those (the only ones with "vllm")."""
    quantization: str | None = None
    """How linear weights are quantized at load (vjx/quantization/: "fp8"), or None."""

    @property
    def architecture(self) -> str:
        return self.hf_config.architectures[0]

    @property
    def hf_text_config(self) -> Any:
        """The language model's config: `hf_config` itself, or the text config nested in a
        multimodal one (Gemma 3's `text_config`), whose sizes the engine reads."""
        return self.hf_config.get_text_config()

    def try_get_generation_config(self) -> dict[str, Any]:
        """The fields the generation config sets; read from the model directory for "auto"
        and also for "vllm" (its EOS ids still stop requests), else from the given one."""
        if self.generation_config in ("auto", "vllm"):
            return gen_config.try_get_generation_config(self.model, self.hf_config)
        return gen_config.try_get_generation_config(self.generation_config)

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """Default sampling parameters, as `SamplingParams` keyword arguments: the
        generation config's (none with "vllm"), with `override_generation_config` on top."""
        config = {} if self.generation_config == "vllm" else self.try_get_generation_config()
        return gen_config.get_diff_sampling_param(config, self.override_generation_config)


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache."""

    block_size: int
    """Tokens per KV block (page)."""
    gpu_memory_utilization: float
    """Fraction of device memory the engine may use, weights and KV cache together."""
    num_gpu_blocks_override: int | None
    """Number of KV blocks to allocate instead of sizing the pool from free memory."""
    enable_prefix_caching: bool
    """Reuse the KV blocks of identical prompt prefixes across requests."""
    prefix_caching_hash_algo: str = "sha256"
    """Hash of a full block's tokens for the prefix cache: "sha256" or "blake2b"."""
    kv_cache_memory_bytes: int | None = None
    """KV cache bytes per device, instead of sizing the pool from free memory (and, on hosts
    without memory statistics, from what `max_num_seqs` requests of `max_model_len` need)."""
    cache_dtype: str = "auto"
    """KV cache element type (the `kv_cache_dtype` argument): "auto" (the model dtype) or "fp8" /
    "fp8_e4m3" (float8_e4m3fn, one byte an element, scaled per tensor by each attention
    layer's `k_scale` / `v_scale`)."""


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """The token budget and the batch limits of one step."""

    max_num_seqs: int
    """Most requests running in one step."""
    max_num_batched_tokens: int
    """Most tokens (prompt and output) computed in one step."""
    max_model_len: int
    """Copy of `ModelConfig.max_model_len`, so the scheduler needs no model config."""
    enable_chunked_prefill: bool
    """Split a long prompt over several steps instead of waiting for a step it fits in."""
    long_prefill_token_threshold: int = 0
    """Most prompt tokens one request computes per step (0: no cap), so a long prompt cannot
    take the whole budget from running decodes."""
    scheduling_policy: str = "fcfs"
    """"fcfs" (arrival order) or "priority" (lower `priority` first, then arrival)."""
    async_scheduling: bool = False
    """Plan step N+1 on the host while the device runs step N."""
    num_lookahead_tokens: int = 0
    """Slots allocated past a request's scheduled tokens: a draft model writes its drafts'
    KV there right after the step (speculative decoding)."""
    num_spec_tokens: int = 0
    """Copy of `SpeculativeConfig.num_speculative_tokens` (0: no speculative decoding), so
    the scheduler needs no speculative config."""
    per_request_spec_decode_metrics: str = "none"
    """vLLM's observability option, read by the scheduler only: "none", "summary" (each
    request's acceptance counts and histogram, on its final output) or "detailed" (also the
    counts of every verify step). "none" without speculative decoding."""
    max_loras: int = 0
    """Most distinct LoRA adapters among the running requests (`LoRAConfig.max_loras`, the
    device's slots); 0: LoRA off."""


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over devices (see vjx/sharding/mesh.py)."""

    tensor_parallel_size: int = 1
    """Devices one engine replica splits attention heads, MLP width and vocabulary over (mesh
    axis `model`)."""
    data_parallel_size: int = 1
    """Independent engine replicas, each with its own scheduler, KV pool and devices."""
    data_parallel_rank: int = 0
    """Which replica this engine is: it runs on this host's
    (`data_parallel_rank - data_parallel_start_rank`)-th group of devices."""
    data_parallel_size_local: int | None = None
    """Replicas on this host (the rest on other hosts, started with `vjx serve --headless`);
    None: all of them."""
    data_parallel_start_rank: int = 0
    """The rank of this host's first replica."""
    data_parallel_address: str = "127.0.0.1"
    """The head's address, which the replicas on other hosts dial."""
    data_parallel_rpc_port: int = 29550
    """The head's port for those replicas' handshakes; their outputs and heartbeats take the
    next two (vjx/engine/remote_engines.py)."""
    enable_expert_parallel: bool = False
    """MoE layers put whole experts on each of the replica's devices instead of splitting
    every expert's width over them (vLLM's flag)."""
    pipeline_parallel_size: int = 1
    """Stages the layers are split into, in order, each on its own `tensor_parallel_size`
    devices (vjx/sharding/pipeline.py)."""
    nnodes: int = 1
    """Processes (one per host) whose devices form the mesh, joined by `jax.distributed`."""
    node_rank: int = 0
    """This process's rank among `nnodes`: 0 runs the scheduler and the front end."""
    master_addr: str = "127.0.0.1"
    """Rank 0's address: JAX's coordinator at `master_port`, vjx's control channel at the
    two ports after it."""
    master_port: int = 29501

    @property
    def local_data_parallel_size(self) -> int:
        """Replicas whose devices are this host's."""
        return self.data_parallel_size if self.data_parallel_size_local is None else self.data_parallel_size_local

    @property
    def data_parallel_rank_local(self) -> int:
        """This replica's index among this host's."""
        return self.data_parallel_rank - self.data_parallel_start_rank


@dataclasses.dataclass(frozen=True)
class StructuredOutputsConfig:
    """How the engine core runs structured outputs (llguidance; vLLM's `structured_outputs_config`)."""

    reasoning_parser: str = ""
    """Name of the reasoning parser (vjx/reasoning): a constrained request's grammar starts
    after its reasoning ends. "": none, the grammar starts with the first output token."""


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's `speculative_config`, parsed by vjx/spec_decode/config.py):
    each step verifies up to `num_speculative_tokens` draft tokens per decoding request."""

    method: str
    """"ngram": drafts copied from the request's own tokens after an earlier match of its last
    n-gram (prompt lookup); "draft_model": a smaller model's greedy tokens."""
    num_speculative_tokens: int
    prompt_lookup_min: int = 5
    """The shortest n-gram that may match."""
    prompt_lookup_max: int = 5
    """The longest n-gram tried first."""
    draft_model_config: "ModelConfig | None" = None
    """"draft_model": the draft model (a smaller model with the target's vocabulary), which
    proposes its greedy tokens."""

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots a request needs past its scheduled tokens: a proposer on the device writes
        its drafts' KV there right after the step (vLLM's lookahead); the n-gram one none."""
        return 0 if self.method == "ngram" else self.num_speculative_tokens


@dataclasses.dataclass(frozen=True)
class VjxConfig:
    """Everything one engine needs to know, built once by `EngineArgs.create_engine_config`."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    attention_backend: str
    """Name in the attention backend registry: "reference", "cpu", "pallas_gpu", "pallas_gpu_mosaic"
    or "pallas_tpu"."""
    multiprocess: bool = False
    """`LLM` runs EngineCore in a child process (ZeroMQ) instead of in its own."""
    structured_outputs_config: StructuredOutputsConfig = StructuredOutputsConfig()
    profile_host: bool = False
    """EngineCore times the host's part of every step and logs it (vjx/engine/step_profiler.py)."""
    peaks: tuple[float | None, float | None] = (None, None)
    """The device's memory bytes/s and dense FLOP/s for MBU and MFU (None: a known device's)."""
    speculative_config: SpeculativeConfig | None = None
    """None: no speculative decoding."""
    lora_config: LoRAConfig | None = None
    """None: no LoRA adapters (`enable_lora` off)."""

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens a request may verify per step (0 without speculative decoding)."""
        return 0 if self.speculative_config is None else self.speculative_config.num_speculative_tokens

    @property
    def num_steps_in_flight(self) -> int:
        """EngineCore's batch queue: 2 with async scheduling (the same requests, their next
        tokens still on the device); with pipeline stages and the synchronous scheduler, one
        per stage (vLLM's batch queue: a request with a step in flight has nothing to
        schedule, so the steps in flight hold different requests and the stages work on them
        at once); else 1."""
        if self.scheduler_config.async_scheduling:
            return 2
        return self.parallel_config.pipeline_parallel_size

    def for_data_parallel_rank(self, rank: int) -> "VjxConfig":
        """This config for engine replica `rank` (its own device group)."""
        parallel_config = dataclasses.replace(self.parallel_config, data_parallel_rank=rank)
        return dataclasses.replace(self, parallel_config=parallel_config)
