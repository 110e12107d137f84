"""LLMEngine: the synchronous front end (tokenize, run EngineCore, detokenize)."""

import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

from vjx import process_setup
from vjx.engine.core_client import InprocClient, SyncMPClient
from vjx.engine.exceptions import EngineRequestError
from vjx.engine.messages import EngineCoreRequest
from vjx.engine.output_processor import OutputProcessor
from vjx.engine.parallel_sampling import ParentRequest
from vjx.engine.processors import make_processors
from vjx.engine_args import EngineArgs
from vjx.lora.request import LoRARequest
from vjx.metrics.loggers import PrometheusStatLogger
from vjx.metrics.reader import Metric, get_metrics_snapshot
from vjx.metrics.stats import IterationStats
from vjx.outputs import RequestOutput
from vjx.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_STATS_INTERVAL_S = 5.0
PROFILER_DIR_ENV = "VLLM_TORCH_PROFILER_DIR"
"""Where `start_profile` writes traces when not given `profile_dir` (vLLM's former torch
profiler directory variable; vLLM 0.32 takes `--profiler-config.torch_profiler_dir`)."""
_PROFILE_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def resolve_trace_dir(profile_prefix: str | None, profile_dir: str | None, **iteration_bounds) -> str:
    """The directory a profile's JAX trace goes to: `profile_dir`, else $VLLM_TORCH_PROFILER_DIR,
    with a `profile_prefix` folder under it when given. The front end reads the variable; the
    engine process only gets the path."""
    if any(bound is not None for bound in iteration_bounds.values()):
        raise ValueError(f"{', '.join(iteration_bounds)} are not supported by vjx: pass None.")
    if profile_prefix is not None and (
        not isinstance(profile_prefix, str) or not _PROFILE_PREFIX.fullmatch(profile_prefix)
    ):
        raise ValueError(
            "profile_prefix must be 1-128 ASCII characters, start with a letter or number, and contain "
            f"only letters, numbers, '.', '_', or '-'; got {profile_prefix!r}."
        )
    profile_dir = profile_dir or os.environ.get(PROFILER_DIR_ENV)
    if not profile_dir:
        raise RuntimeError(f"Profiling is not enabled: pass profile_dir or set {PROFILER_DIR_ENV}.")
    profile_dir = os.path.abspath(os.path.expanduser(profile_dir))
    return os.path.join(profile_dir, profile_prefix) if profile_prefix else profile_dir


def register_request(
    output_processor: OutputProcessor, request: EngineCoreRequest, prompt_text: str | None
) -> list[EngineCoreRequest]:
    """Starts tracking a request in the output processor; returns what EngineCore must run:
    the request itself, or its n children when `n > 1` (seen as one request outside)."""
    if request.sampling_params.n == 1:
        output_processor.add_request(request, prompt_text)
        return [request]
    parent = ParentRequest(request, prompt_text)
    output_processor.add_parent_request(parent)
    children = []
    for index in range(parent.sampling_params.n):
        child = parent.make_child_request(index)
        output_processor.add_request(child, prompt_text, parent, index)
        children.append(child)
    return children


class LLMEngine:
    """vLLM's LLMEngine: `add_request` then `step` until `has_unfinished_requests` is False."""

    def __init__(self, engine_args: EngineArgs):
        process_setup.setup_process()
        self.config = engine_args.create_engine_config()
        self.tokenizer, self.input_processor, self.output_processor = make_processors(
            self.config.model_config, self.config.lora_config
        )
        if self.config.multiprocess:
            self.engine_core = SyncMPClient(engine_args)
        else:
            self.engine_core = InprocClient(self.config)
        self.log_stats = not engine_args.disable_log_stats
        self.is_profiling = False
        self._last_stats_time = time.monotonic()
        self.stat_logger = self._make_stat_logger() if self.log_stats else None
        # Full collections skip the start-up heap (tokenizer, engine client) while this lives.
        process_setup.engine_started(self)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args)

    def get_tokenizer(self):
        return self.tokenizer

    def add_request(
        self,
        request_id: str,
        prompt,
        params: SamplingParams,
        priority: int = 0,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Adds a request; one with `n > 1` runs as n child requests, seen as one.

        `prompt_text` is what its outputs report as `prompt` when the prompt is given as
        token ids (a rendered chat, say). A request added while the engine sleeps waits
        for `wake_up`."""
        request, text = self.input_processor.process_inputs(
            request_id, prompt, params, priority=priority, lora_request=lora_request
        )
        prompt_text = text if prompt_text is None else prompt_text
        for engine_request in register_request(self.output_processor, request, prompt_text):
            self.engine_core.add_request(engine_request)

    def abort_request(self, request_ids: list[str]) -> None:
        """Aborts unfinished requests (a parent's id aborts all its children)."""
        self.engine_core.abort_requests(self.output_processor.abort_requests(request_ids))

    def step(self) -> list[RequestOutput]:
        """One step's outputs; raises EngineRequestError (the request is dropped) when the
        engine process refused a request."""
        try:
            outputs = self.engine_core.get_output()
        except EngineRequestError as e:
            self.output_processor.abort_requests([e.request_id])
            raise
        iteration_stats = IterationStats() if self.log_stats else None
        # The in-process client gathers its replicas' outputs in a batch made before they ran, so
        # the clock after the step (the same monotonic clock as EngineCore's) stands for its end.
        processed = self.output_processor.process_outputs(outputs.outputs, time.monotonic(), iteration_stats)
        self.engine_core.abort_requests(processed.reqs_to_abort)
        if self.log_stats:
            if outputs.outputs:
                self.stat_logger.record_iteration_stats(iteration_stats)
            self._maybe_log_stats()
        return processed.request_outputs

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_stats_time >= _STATS_INTERVAL_S:
            self._last_stats_time = now
            stats = self.engine_core.make_stats()
            self.stat_logger.record_scheduler_stats(stats)
            logger.info("%s", stats)

    def _make_stat_logger(self) -> PrometheusStatLogger:
        """vLLM's metrics in this engine's own registry, named `vjx:` and labelled with the model."""
        config = self.config
        stat_logger = PrometheusStatLogger(
            config.model_config.model,
            config.model_config.max_model_len,
            num_speculative_tokens=config.num_speculative_tokens,
        )
        core = self.engine_core
        num_gpu_blocks = core.ready.num_gpu_blocks if config.multiprocess else core.engine_core.num_gpu_blocks
        stat_logger.log_cache_config(config.cache_config, num_gpu_blocks)
        return stat_logger

    def get_metrics(self) -> list[Metric]:
        """vLLM's metrics snapshot (scheduler gauges read now); needs `disable_log_stats=False`."""
        if self.stat_logger is None:
            raise ValueError("get_metrics needs stats logging: create the engine with disable_log_stats=False.")
        self.stat_logger.record_scheduler_stats(self.engine_core.make_stats())
        return get_metrics_snapshot(self.stat_logger.registry, self.stat_logger.prefix)

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Reads the adapter into the engine's host memory ahead of its requests (a bad one
        raises ValueError here); False when it was there already."""
        self.input_processor.check_lora_request(lora_request)
        return self.engine_core.call_utility("add_lora", lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Forgets adapter `lora_id`; its requests still running keep it until they finish."""
        return self.engine_core.call_utility("remove_lora", lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        """Keeps adapter `lora_id` in host memory until it is removed."""
        return self.engine_core.call_utility("pin_lora", lora_id)

    def list_loras(self) -> set[int]:
        """The ids of the adapters the engine holds in host memory."""
        return self.engine_core.call_utility("list_loras")

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """See `EngineCore.sleep`; with `mode="abort"` the unfinished requests end here too."""
        if mode == "abort":
            processor = self.output_processor
            self.abort_request([*processor.parent_requests, *processor.request_states])
        self.engine_core.sleep(level, mode)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        return self.engine_core.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine_core.is_sleeping()

    def start_profile(self, profile_prefix: str | None = None, *, profile_dir: str | None = None, **bounds) -> None:
        """Starts a JAX profiler trace in the process that runs the model (see
        `resolve_trace_dir`); `bounds` are vLLM's delay_iterations and max_iterations."""
        if self.is_profiling:
            raise RuntimeError("A profile is already running: call stop_profile() first.")
        self.engine_core.profile(True, resolve_trace_dir(profile_prefix, profile_dir, **bounds))
        self.is_profiling = True

    def stop_profile(self) -> None:
        """Stops the trace and writes it; a warning when none runs."""
        if not self.is_profiling:
            logger.warning("The profiler was not started, nothing to stop.")
            return
        self.is_profiling = False
        self.engine_core.profile(False)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """`Worker.<method>(*args, **kwargs)`, or `method(worker, *args, **kwargs)`, on every
        worker (one per data-parallel replica); with the engine in its own process a callable
        is pickled (cloudpickle when installed, else pickle: module-level functions only)."""
        return self.engine_core.collective_rpc(method, timeout, args, kwargs)

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        """`func(model)` on each worker's Flax NNX model."""
        return self.collective_rpc("apply_model", args=(func,))

    def shutdown(self) -> None:
        """Stops the engine core (its process, if it runs one); safe to call more than once."""
        self.engine_core.shutdown()
        process_setup.engine_stopped(self)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()
