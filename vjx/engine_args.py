"""EngineArgs: the user's engine arguments (vLLM's names and defaults) -> a frozen VjxConfig.

The command-line flags are generated from the fields below; each field's `help` is its doc.
Every other field of vLLM's EngineArgs is accepted too: `VllmCompatArgs` declares them, and
vjx/engine/vllm_args.py says, field by field, what vjx does with each.
"""

import argparse
import dataclasses
import importlib.util
import logging
import os
import typing

import jax
import transformers

from vjx.attention.backend import default_backend_name
from vjx.config import (
    CPU_MAX_NUM_BATCHED_TOKENS,
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
    VjxConfig,
)
from vjx.engine.parallel_args import verify_data_parallel, verify_multi_node
from vjx.engine.vllm_args import FLAG_ALIASES, SERVER, VLLM_ARG_BY_NAME, VllmCompatArgs, verify_vllm_args
from vjx.kv_cache_interface import KV_CACHE_DTYPES
from vjx.lora.config import MAX_LORA_RANK_LIMIT, create_lora_config
from vjx.models import hub
from vjx.models.registry import verify_tensor_parallel
from vjx.quantization import QUANTIZATION_METHODS, get_quantization_config
from vjx.sampling_params import SamplingParams
from vjx.sharding.mesh import device_groups
from vjx.sharding.pipeline import stage_layer_ranges
from vjx.spec_decode.config import create_speculative_config, merge_spec_shorthands, with_draft_model
from vjx.spec_decode.request_metrics import SPEC_DECODE_METRICS_LEVELS
from vjx.utils.argparse_utils import flag_kwargs, json_object

logger = logging.getLogger(__name__)

_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}
_LOAD_FORMATS = ("auto", "safetensors", "dummy", "orbax")
_BLOCK_SIZES = (8, 16, 32, 64, 128)
_POLICIES = ("fcfs", "priority")
_HASH_ALGOS = ("sha256", "blake2b")
# Accelerators take vLLM's offline default.
_DEFAULT_BATCHED_TOKENS = {"cpu": CPU_MAX_NUM_BATCHED_TOKENS}
_DEFAULT_BATCHED_TOKENS_ACCEL = 8192
# Without chunked prefill a whole prompt must fit the budget (vLLM's floor).
_MIN_UNCHUNKED_BATCHED_TOKENS = 2048


def _field(default, help: str):
    return dataclasses.field(default=default, metadata={"help": help})


# vLLM leaves these None for "the platform's default"; vjx's defaults are the fields' own.
_MULTI_NODE_ENV = {
    "nnodes": "VJX_NNODES",
    "node_rank": "VJX_NODE_RANK",
    "master_addr": "VJX_MASTER_ADDR",
    "master_port": "VJX_MASTER_PORT",
}
"""The environment's form of each multi-node flag, read when the flag is left at its default."""
_EXECUTOR_BACKENDS = ("uni", "mp", "ray")
_DATA_PARALLEL_ADDRESS = "127.0.0.1"
_DATA_PARALLEL_RPC_PORT = 29550
_NONE_IS_DEFAULT = ("block_size", "max_num_seqs", "enable_prefix_caching", "enable_chunked_prefill")


def _flag_type(field_type):
    """What a flag's value is parsed with: the type (of `T | None`, T's), JSON for dicts."""
    if typing.get_origin(field_type) is dict:
        return json_object
    return ([a for a in typing.get_args(field_type) if a is not type(None)] or [field_type])[0]


def _flag_kwargs(field: dataclasses.Field) -> dict:
    """`add_argument` keywords of a field's flag: vLLM's value type for vLLM's fields."""
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    if field.name in VLLM_ARG_BY_NAME:
        kwargs = flag_kwargs(VLLM_ARG_BY_NAME[field.name].flag, default)
    elif _flag_type(field.type) is bool:
        kwargs = {"action": argparse.BooleanOptionalAction, "default": default}
    else:
        kwargs = {"type": _flag_type(field.type), "default": default}
    return {**kwargs, "help": field.metadata["help"]}


def _has_flag(field: dataclasses.Field) -> bool:
    """vLLM's fields without a flag of vLLM's get none; SERVER ones are `vjx serve`'s own flags."""
    arg = VLLM_ARG_BY_NAME.get(field.name)
    return arg is None or (arg.flag is not None and arg.kind != SERVER)


@dataclasses.dataclass
class EngineArgs(VllmCompatArgs):
    model: str | None = _field(
        None,
        "Name or path of the Hugging Face model: a model directory, a Hub model id ('org/name', "
        "downloaded into the hub cache) or an embedded model's name; None uses the embedded "
        "SmolLM2-135M-Instruct.",
    )
    tokenizer: str | None = _field(
        None, "Name or path of the Hugging Face tokenizer (a directory or a Hub model id); the model's when None."
    )
    revision: str | None = _field(
        None,
        "The specific model version to use. It can be a branch name, a tag name, or a commit id. "
        "If unspecified, will use the default version.",
    )
    tokenizer_revision: str | None = _field(
        None,
        "The specific revision to use for the tokenizer on the Hugging Face Hub. It can be a "
        "branch name, a tag name, or a commit id. If unspecified, the model's revision.",
    )
    download_dir: str | None = _field(
        None,
        "Directory to download and load the weights, default to the default cache directory "
        "of Hugging Face (HF_HUB_CACHE, or HF_HOME/hub).",
    )
    generation_config: str = _field(
        "auto",
        "The folder path to the generation config. Defaults to 'auto', the generation config "
        "will be loaded from model path. If set to 'vllm', no generation config is loaded, "
        "vLLM defaults will be used. If set to a folder path, the generation config will be "
        "loaded from the specified folder path. If max_new_tokens is specified in a generation "
        "config given as a folder path (or in override_generation_config), then it sets a "
        "server-wide limit on the number of output tokens for all requests.",
    )
    override_generation_config: dict[str, typing.Any] = dataclasses.field(
        default_factory=dict,
        metadata={
            "help": "Overrides or sets generation config (a JSON object on the command line), "
            'e.g. {"temperature": 0.5}. If used with --generation-config auto, the override '
            "parameters will be merged with the default config from the model. If used with "
            "--generation-config vllm, only the override parameters are used."
        },
    )
    dtype: str = _field(
        "auto",
        "auto, float32, bfloat16 or float16. auto: the checkpoint's dtype "
        "on CPU, bfloat16 for float32 checkpoints on accelerators.",
    )
    seed: int = _field(0, "Seed for dummy weights and for requests without a seed of their own.")
    max_model_len: int | None = _field(None, "Most tokens per request; the model's context length when None.")
    block_size: int | None = _field(16, f"Tokens per KV cache block, one of {_BLOCK_SIZES} (None: 16).")
    gpu_memory_utilization: float = _field(0.9, "Fraction of device memory for weights and KV cache, in (0, 1].")
    num_gpu_blocks_override: int | None = _field(None, "Number of KV blocks, instead of sizing from free memory.")
    kv_cache_memory_bytes: int | None = _field(
        None,
        "KV cache bytes per device, instead of sizing from free memory "
        "(on CPU: what max_num_seqs requests of max_model_len need, at most "
        "4 GiB).",
    )
    max_num_seqs: int | None = _field(256, "Most requests in one step (None: 256).")
    max_num_batched_tokens: int | None = _field(None, "Token budget of one step; 8192 on accelerators, 512 on CPU.")
    enable_prefix_caching: bool | None = _field(True, "Reuse KV blocks of shared prompt prefixes (None: on).")
    prefix_caching_hash_algo: str = _field("sha256", f"Block hash of the prefix cache: one of {_HASH_ALGOS}.")
    enable_chunked_prefill: bool | None = _field(True, "Split long prompts over several steps (None: on).")
    long_prefill_token_threshold: int = _field(0, "Most prompt tokens a request computes per step; 0 = no cap.")
    scheduling_policy: str = _field("fcfs", f"One of {_POLICIES}: arrival order, or lower priority value first.")
    async_scheduling: bool | None = _field(
        None,
        "Plan the next step while the device runs this one; "
        "on by default on accelerators (when both are installed), off on CPU.",
    )
    disable_log_stats: bool = _field(False, "Do not log scheduler statistics every few seconds.")
    profile_host: bool = _field(
        False,
        "Time the host's part of every engine step (schedule, dispatch, "
        "collect, update) and log the means every 100 steps.",
    )
    peak_memory_bandwidth: float | None = _field(None, "Device memory bytes/s for MBU (None: a known device's).")
    peak_flops: float | None = _field(None, "Device dense FLOP/s for MFU (None: a known device's).")
    tensor_parallel_size: int = _field(
        1,
        "Devices each engine replica splits the model over (attention heads, "
        "MLP width and vocabulary); must divide the head count.",
    )
    pipeline_parallel_size: int = _field(
        1,
        "Pipeline stages each engine replica splits the layers into, each on its own "
        "tensor_parallel_size devices; at most the model's layer count.",
    )
    data_parallel_size: int = _field(
        1,
        "Engine replicas, each on its own tensor_parallel_size devices with its "
        "own scheduler and KV cache; requests go to the least loaded one.",
    )
    data_parallel_size_local: int | None = _field(
        None,
        "Replicas on this host, ranks data_parallel_start_rank onward; the others run on other hosts, each "
        "started with `vjx serve --headless` (None: all data_parallel_size replicas are this host's).",
    )
    data_parallel_start_rank: int | None = _field(
        None, "The rank of this host's first replica: 0 on the head (None), above 0 on a headless host."
    )
    data_parallel_address: str | None = _field(
        None, "The head's address, which every host's replicas dial (None: 127.0.0.1)."
    )
    data_parallel_rpc_port: int | None = _field(
        None,
        "The head's port for the other hosts' replicas; their outputs and heartbeats take the next two "
        f"(None: {_DATA_PARALLEL_RPC_PORT}).",
    )
    enable_expert_parallel: bool = _field(
        False,
        "MoE models: each of a replica's tensor_parallel_size devices holds whole experts "
        "(num_experts must divide evenly) instead of a slice of every expert's width.",
    )
    distributed_executor_backend: str | None = _field(
        None,
        "How the engine reaches its devices: 'uni' (this process drives them all; the default on one "
        "host), 'mp' (one process per host joined by jax.distributed, the others started with `vjx serve "
        "--headless`; the default when nnodes > 1) or 'ray' (as 'mp', the other hosts' processes started "
        "as actors of the running Ray cluster; needs the [ray] extra).",
    )
    nnodes: int = _field(
        1,
        "Hosts the engine spans, one process each (environment: VJX_NNODES); their devices form one "
        "mesh for tensor_parallel_size. Rank 0 serves; the others run `vjx serve --headless`.",
    )
    node_rank: int = _field(0, "This host's rank, 0 to nnodes - 1 (environment: VJX_NODE_RANK).")
    master_addr: str = _field(
        "127.0.0.1",
        "Rank 0's address, which every rank can reach (environment: VJX_MASTER_ADDR).",
    )
    master_port: int = _field(
        29501,
        "JAX's coordinator port on rank 0; vjx's control channel takes the next two (environment: VJX_MASTER_PORT).",
    )
    speculative_config: dict[str, typing.Any] | None = _field(
        None,
        "Speculative decoding, with vLLM's keys (a JSON object on the command line), e.g. "
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}: each step verifies '
        "the drafts of every decoding request and keeps the tokens the model itself would draw.",
    )
    spec_method: str | None = _field(None, "Shorthand for speculative_config's method.")
    spec_model: str | None = _field(None, "Shorthand for speculative_config's model.")
    spec_tokens: int | None = _field(None, "Shorthand for speculative_config's num_speculative_tokens.")
    per_request_spec_decode_metrics: str = _field(
        "none",
        f"One of {list(SPEC_DECODE_METRICS_LEVELS)}: a response to a request of one sequence carries its "
        "speculative decoding under metrics.speculative_decoding. 'summary': the mean acceptance length "
        "(bonus token included), the draft acceptance rate and the histogram of drafts accepted per verify "
        "step; 'detailed': also the accepted and drafted counts of every verify step. Needs speculative_config.",
    )
    enable_lora: bool = _field(False, "Serve LoRA adapters: requests name one with a LoRARequest.")
    max_loras: int = _field(1, "Adapters on the device at once (the most distinct ones in a step).")
    max_lora_rank: int = _field(16, f"Largest adapter rank, 1 to {MAX_LORA_RANK_LIMIT}.")
    max_cpu_loras: int | None = _field(None, "Adapters kept in host memory, >= max_loras (None: max_loras).")
    load_format: str = _field("auto", f"How to read weights: one of {_LOAD_FORMATS}.")
    quantization: str | None = _field(
        None,
        "How weights are quantized: a quantized checkpoint's method (fp8, compressed-tensors, awq, "
        "gptq, mxfp4 experts: read from its config when None), or on an unquantized one 'fp8' / "
        "'ptpc_fp8' (float8_e4m3fn at load, a scale per tensor / per output channel, activations "
        "per token; MoE experts FP8 with the activations in the model dtype).",
    )
    kv_cache_dtype: str = _field(
        "auto",
        f"KV cache element type, one of {list(KV_CACHE_DTYPES)}: 'auto' is the model dtype; 'fp8' "
        "(alias 'fp8_e4m3') stores float8_e4m3fn, one byte an element (twice the blocks of bfloat16 in "
        "the same memory), keys and values divided by each attention layer's k_scale / v_scale (1.0).",
    )
    reasoning_parser: str = _field(
        "",
        "Reasoning parser of the model's think blocks (e.g. deepseek_r1, qwen3): the server "
        "returns the reasoning apart, and structured outputs constrain only what follows it.",
    )
    max_logprobs: int = _field(20, "Most logprobs (and prompt logprobs) a request may ask for.")
    attention_backend: str | None = _field(None, "Attention backend name; the platform's default when None.")
    multiprocess: bool | None = _field(
        None,
        "Run EngineCore in its own process (needs pyzmq and msgspec); "
        "on by default on accelerators (when both are installed), off on CPU.",
    )

    def __post_init__(self):
        for name in _NONE_IS_DEFAULT:
            if getattr(self, name) is None:
                setattr(self, name, type(self).__dataclass_fields__[name].default)
        for name, env in _MULTI_NODE_ENV.items():
            default = type(self).__dataclass_fields__[name].default
            if getattr(self, name) == default and env in os.environ:
                setattr(self, name, type(default)(os.environ[env]))
        verify_vllm_args(self)
        # A speculative_config vjx cannot run (or metrics without one) is refused before any model loads.
        _verify_spec_decode_metrics(self.per_request_spec_decode_metrics, self._speculative_config())
        create_lora_config(self.enable_lora, self.max_loras, self.max_lora_rank, self.max_cpu_loras)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}.")
        if self.distributed_executor_backend not in (None, *_EXECUTOR_BACKENDS):
            raise ValueError(
                f"distributed_executor_backend={self.distributed_executor_backend!r} is not supported by vjx: "
                f"the backends built are {list(_EXECUTOR_BACKENDS)}."
            )
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization={self.quantization!r} is not supported by vjx: the methods built are "
                f"{sorted(QUANTIZATION_METHODS)}; leave it at vLLM's default (None) for the checkpoint's dtype."
            )

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Adds a `--flag-name` per field (and vLLM's short spellings, e.g. `-tp`) to `parser`
        and returns it (vLLM's contract)."""
        vllm_only = {f.name for f in dataclasses.fields(VllmCompatArgs)}
        group = parser.add_argument_group(
            "vLLM engine arguments vjx does not implement",
            "Taken so that vLLM's command lines run: each says why it has no effect, or that only "
            "vLLM's default is accepted.",
        )
        fields = sorted(dataclasses.fields(cls), key=lambda f: f.name in vllm_only)
        for f in filter(_has_flag, fields):
            flags = ["--" + f.name.replace("_", "-"), *FLAG_ALIASES.get(f.name, ())]
            (group if f.name in vllm_only else parser).add_argument(*flags, **_flag_kwargs(f))
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if _has_flag(f)})

    def create_engine_config(self) -> VjxConfig:
        """The frozen config. Its platform queries start JAX's backends: entry points call
        `vjx.process_setup.setup_process()` before it."""
        self._verify_args()
        model = self._resolve_model()
        hf_config = transformers.AutoConfig.from_pretrained(model)
        max_model_len = self._max_model_len(hf_config.get_text_config())
        model_config = ModelConfig(
            model=model,
            tokenizer=self._resolve_tokenizer(model),
            hf_config=hf_config,
            dtype=self._dtype(hf_config),
            max_model_len=max_model_len,
            seed=self.seed,
            load_format=self.load_format,
            max_logprobs=self.max_logprobs,
            generation_config=self.generation_config,
            override_generation_config=dict(self.override_generation_config),
            quantization=self.quantization,
        )
        _verify_generation_config(model_config)
        quant_config = get_quantization_config(self.quantization, hf_config)
        self._verify_pipeline(hf_config.get_text_config(), quant_config)
        parallel_config = self.create_parallel_config()
        if self.node_rank > 0:
            raise ValueError(
                f"node_rank={self.node_rank}: the engine runs on rank 0; rank {self.node_rank} runs "
                f"`vjx serve --headless --nnodes {self.nnodes} --node-rank {self.node_rank} --master-addr ...`."
            )
        verify_tensor_parallel(hf_config.get_text_config(), self.tensor_parallel_size, self.enable_expert_parallel)
        # Over several hosts the devices are counted once this process has joined the others.
        if self.nnodes == 1 or jax.distributed.is_initialized():
            device_groups(parallel_config)
        speculative_config = self._speculative_config(model_config)
        scheduler_config = self._scheduler_config(max_model_len, speculative_config)
        return VjxConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size,
                gpu_memory_utilization=self.gpu_memory_utilization,
                num_gpu_blocks_override=self.num_gpu_blocks_override,
                kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                enable_prefix_caching=self.enable_prefix_caching,
                prefix_caching_hash_algo=self.prefix_caching_hash_algo,
                cache_dtype=self.kv_cache_dtype,
            ),
            scheduler_config=scheduler_config,
            parallel_config=parallel_config,
            attention_backend=self.attention_backend or default_backend_name(scheduler_config.max_num_batched_tokens),
            multiprocess=self._multiprocess(),
            structured_outputs_config=StructuredOutputsConfig(reasoning_parser=self.reasoning_parser),
            profile_host=self.profile_host,
            peaks=(self.peak_memory_bandwidth, self.peak_flops),
            speculative_config=speculative_config,
            lora_config=create_lora_config(self.enable_lora, self.max_loras, self.max_lora_rank, self.max_cpu_loras),
        )

    def create_parallel_config(self) -> ParallelConfig:
        """The layout over devices (replica 0's; each replica's engine takes its own rank)."""
        verify_multi_node(self)
        verify_data_parallel(self)
        return ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size,
            data_parallel_size_local=self.data_parallel_size_local,
            data_parallel_start_rank=self.data_parallel_start_rank or 0,
            data_parallel_address=self.data_parallel_address or _DATA_PARALLEL_ADDRESS,
            data_parallel_rpc_port=self.data_parallel_rpc_port or _DATA_PARALLEL_RPC_PORT,
            enable_expert_parallel=self.enable_expert_parallel,
            nnodes=self.nnodes,
            node_rank=self.node_rank,
            master_addr=self.master_addr,
            master_port=self.master_port,
        )

    def _verify_args(self) -> None:
        if self.block_size not in _BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {_BLOCK_SIZES}, got {self.block_size}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ValueError(f"num_gpu_blocks_override must be at least 2, got {self.num_gpu_blocks_override}.")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes must be at least 1, got {self.kv_cache_memory_bytes}.")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}.")
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {self.data_parallel_size}.")
        if self.reasoning_parser:
            from vjx.reasoning import ReasoningParserManager

            names = ReasoningParserManager.list_registered()
            if self.reasoning_parser not in names:
                raise ValueError(f"reasoning_parser must be one of {names}, got {self.reasoning_parser!r}.")
        if self.load_format not in _LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {_LOAD_FORMATS}, got {self.load_format!r}.")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}.")
        if self.scheduling_policy not in _POLICIES:
            raise ValueError(f"scheduling_policy must be one of {_POLICIES}, got {self.scheduling_policy!r}.")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}.")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise ValueError("long_prefill_token_threshold needs enable_chunked_prefill=True (it caps prompt chunks).")
        if self.prefix_caching_hash_algo not in _HASH_ALGOS:
            raise ValueError(
                f"prefix_caching_hash_algo must be one of {_HASH_ALGOS}, got {self.prefix_caching_hash_algo!r}."
            )
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}.")
        self._verify_generation_args()

    def _verify_generation_args(self) -> None:
        named = self.generation_config in ("auto", "vllm")
        if not named and not os.path.isfile(os.path.join(self.generation_config, "generation_config.json")):
            raise ValueError(
                "generation_config must be 'auto', 'vllm' or a directory holding a generation_config.json, "
                f"got {self.generation_config!r}."
            )
        if not isinstance(self.override_generation_config, dict):
            raise ValueError(
                f"override_generation_config must be a dict, got {type(self.override_generation_config).__name__}."
            )

    def _resolve_model(self) -> str:
        """The model's directory: the embedded model's, the one given, or a Hub model's
        snapshot (downloaded at `revision` into `download_dir` when not there yet)."""
        from vjx.models import default_model

        if self.model is None:
            return default_model.get_default_model_path()
        if self.model in default_model.EMBEDDED_MODELS:
            return default_model.get_embedded_model_path(self.model)
        if self._is_hub_model():
            return hub.download_model(self.model, self.revision, self.download_dir)
        if not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ValueError(f"model must be a Hugging Face model directory with a config.json, got {self.model!r}.")
        return self.model

    def _resolve_tokenizer(self, model_dir: str) -> str:
        """The tokenizer's directory. As in vLLM the tokenizer defaults to the model and
        `tokenizer_revision` to `revision`: a Hub model's snapshot holds its tokenizer,
        unless another revision of it is asked for."""
        revision = self.revision if self.tokenizer_revision is None else self.tokenizer_revision
        if self.tokenizer is not None:
            if os.path.isdir(self.tokenizer):
                return self.tokenizer
            return hub.download_tokenizer(self.tokenizer, revision, self.download_dir)
        if self._is_hub_model() and revision != self.revision:
            return hub.download_tokenizer(self.model, revision, self.download_dir)
        return model_dir

    def _is_hub_model(self) -> bool:
        from vjx.models import default_model

        embedded = default_model.EMBEDDED_MODELS
        return self.model is not None and self.model not in embedded and not os.path.isdir(self.model)

    def _dtype(self, hf_config) -> str:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        dtype = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "float32")
        dtype = _DTYPES.get(dtype.removeprefix("torch."), "float32")
        if dtype == "float32" and jax.default_backend() != "cpu":
            return "bfloat16"
        return dtype

    def _max_model_len(self, hf_config) -> int:
        limit = getattr(hf_config, "max_position_embeddings", None)
        if self.max_model_len is None:
            if limit is None:
                raise ValueError("max_model_len must be given: the model config has no max_position_embeddings.")
            return limit
        if self.max_model_len < 1 or (limit is not None and self.max_model_len > limit):
            raise ValueError(
                f"max_model_len must be in [1, {limit}] (the model's max_position_embeddings), "
                f"got {self.max_model_len}."
            )
        return self.max_model_len

    def _scheduler_config(self, max_model_len: int, speculative_config: SpeculativeConfig | None) -> SchedulerConfig:
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = _DEFAULT_BATCHED_TOKENS.get(jax.default_backend(), _DEFAULT_BATCHED_TOKENS_ACCEL)
            if not self.enable_chunked_prefill:
                budget = max(max_model_len, _MIN_UNCHUNKED_BATCHED_TOKENS)
        if budget < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be greater than or equal to "
                f"max_num_seqs ({self.max_num_seqs})."
            )
        if not self.enable_chunked_prefill and budget < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be at least max_model_len "
                f"({max_model_len}) when enable_chunked_prefill is False."
            )
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            scheduling_policy=self.scheduling_policy,
            async_scheduling=self._async_scheduling(speculative_config),
            num_lookahead_tokens=0 if speculative_config is None else speculative_config.num_lookahead_tokens,
            num_spec_tokens=0 if speculative_config is None else speculative_config.num_speculative_tokens,
            per_request_spec_decode_metrics=self.per_request_spec_decode_metrics,
            max_loras=self.max_loras if self.enable_lora else 0,
        )

    def _verify_pipeline(self, hf_text_config, quant_config) -> None:
        if self.pipeline_parallel_size == 1:
            return
        stage_layer_ranges(hf_text_config.num_hidden_layers, self.pipeline_parallel_size)
        if quant_config is not None:
            raise ValueError(
                f"pipeline_parallel_size={self.pipeline_parallel_size} with a quantized model "
                f"({quant_config.get_name()}) is not built yet; use pipeline_parallel_size=1."
            )
        if self.nnodes > 1:
            raise ValueError(
                f"pipeline_parallel_size={self.pipeline_parallel_size} over nnodes={self.nnodes} hosts "
                "is not built yet."
            )

    def _multiprocess(self) -> bool:
        if self.nnodes > 1 or self.create_parallel_config().local_data_parallel_size < self.data_parallel_size:
            # A rank's death must not hang the caller: the engine process is ended instead.
            return True
        have_packages = all(importlib.util.find_spec(name) is not None for name in ("zmq", "msgspec"))
        if self.multiprocess is None:
            # Without the [serve] extra the engine stays in this process rather than failing.
            return jax.default_backend() != "cpu" and have_packages
        if self.multiprocess and not have_packages:
            raise ValueError("multiprocess=True needs pyzmq and msgspec (pip install 'vjx[serve]').")
        return self.multiprocess

    def _speculative_config_dict(self) -> dict[str, typing.Any] | None:
        return merge_spec_shorthands(self.speculative_config, self.spec_method, self.spec_model, self.spec_tokens)

    def _speculative_config(self, target: ModelConfig | None = None) -> SpeculativeConfig | None:
        """The checked config; with the `target` model's config, a draft model's config too."""
        config = create_speculative_config(self._speculative_config_dict())
        if config is not None and config.method != "ngram":
            if self.nnodes > 1:
                raise ValueError(
                    f"speculative_config method={config.method!r} over nnodes={self.nnodes} is not built yet."
                )
            if target is not None:
                # The draft model is found as the target is: embedded, a directory or a Hub id.
                name = self._speculative_config_dict()["model"]
                draft = dataclasses.replace(
                    self, model=name, speculative_config=None, spec_method=None, spec_tokens=None
                )
                config = with_draft_model(config, dataclasses.replace(draft, spec_model=None)._resolve_model(), target)
        if config is not None and self.pipeline_parallel_size > 1:
            raise ValueError(
                f"speculative_config with pipeline_parallel_size={self.pipeline_parallel_size} is not built yet."
            )
        if config is not None and self.async_scheduling and config.method == "ngram":
            raise ValueError(
                "async_scheduling=True with speculative_config method='ngram' is not supported: the n-gram "
                "proposer reads the tokens of the step before, on the host (as in vLLM); use an EAGLE head or "
                "a draft model, which propose on the device, or leave async_scheduling unset."
            )
        return config

    def _async_scheduling(self, speculative_config: SpeculativeConfig | None) -> bool:
        """Unset: on, but not on the CPU backend nor with the n-gram proposer (as vLLM does)."""
        if speculative_config is not None and speculative_config.method == "ngram":
            return False
        if self.async_scheduling is None:
            return jax.default_backend() != "cpu"
        return self.async_scheduling


def _verify_spec_decode_metrics(level: str, speculative_config: SpeculativeConfig | None) -> None:
    if level not in SPEC_DECODE_METRICS_LEVELS:
        raise ValueError(
            f"per_request_spec_decode_metrics must be one of {list(SPEC_DECODE_METRICS_LEVELS)}, got {level!r}."
        )
    if level != "none" and speculative_config is None:
        raise ValueError(
            f"per_request_spec_decode_metrics={level!r} needs speculative decoding: set speculative_config "
            "(--speculative-config), or leave it at 'none'."
        )


def _verify_generation_config(model_config: ModelConfig) -> None:
    """Builds the default sampling parameters once, so a generation config the engine cannot
    take fails at start-up rather than in every request."""
    defaults = model_config.get_diff_sampling_param()
    try:
        SamplingParams(**defaults)
    except ValueError as e:
        raise ValueError(f"generation_config sets a default sampling parameter out of range: {e}") from None
    if defaults:
        logger.info(
            "Default sampling parameters from the model's generation config: %s (generation_config='vllm' "
            "keeps vLLM's defaults).",
            defaults,
        )


@dataclasses.dataclass
class AsyncEngineArgs(EngineArgs):
    """The arguments of `AsyncLLM` (vLLM's name); the same fields as `EngineArgs` (which takes
    vLLM's AsyncEngineArgs-only `enable_log_requests` too)."""
