"""EngineCore: the hub of the engine. `step()` = schedule -> execute -> update."""

import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import jax

from vjx import process_setup
from vjx.config import VjxConfig
from vjx.core.request import Request, RequestStatus
from vjx.core.sched.async_scheduler import AsyncScheduler
from vjx.core.sched.output import SchedulerOutput
from vjx.core.sched.scheduler import Scheduler
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest
from vjx.engine.step_profiler import NullStepProfiler, StepProfiler
from vjx.executor.abstract import Executor
from vjx.lora.request import LoRARequest
from vjx.metrics.utilization import Utilization, UtilizationMeter, device_peak
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)

SLEEP_LEVELS = (0, 1, 2)
PAUSE_MODES = ("abort", "keep")
WAKE_UP_TAGS = ("weights", "kv_cache", "scheduling")


class EngineCore:
    """Owns the scheduler and the executor; knows nothing of text or HTTP."""

    is_paused: bool = False
    """Asleep at any level (set by `sleep`): requests added meanwhile wait, none is scheduled."""
    sleep_level: int = 0
    """The level of the last `sleep` (what `make_stats` reports while asleep)."""
    utilization: UtilizationMeter | None = None
    """MBU and MFU of the steps (vjx/metrics/utilization.py); None where no device peak is known."""

    def __init__(self, config: VjxConfig, executor_class: type[Executor] | None = None):
        # Engines dropped since an earlier one started must free their memory before this
        # one measures what is free; the persistent compilation cache is on for every engine.
        process_setup.engine_starting()
        self.config = config
        self.model_executor = (executor_class or Executor.get_class(config))(config)
        start = time.perf_counter()
        kv_cache_config = self.model_executor.determine_kv_cache_config()
        # On devices with memory statistics, sizing loads or compiles the largest step.
        self.kv_sizing_time = time.perf_counter() - start
        self.num_gpu_blocks = kv_cache_config.num_blocks
        is_async = config.scheduler_config.async_scheduling
        scheduler_class = AsyncScheduler if is_async else Scheduler
        self.structured_output_manager = StructuredOutputManager.from_config(config)
        # Before the warm-up: a pool too small for its groups is refused without compiling.
        self.scheduler = scheduler_class(
            config.scheduler_config, config.cache_config, kv_cache_config, self.structured_output_manager
        )
        start = time.perf_counter()
        self.model_executor.initialize_from_config(kv_cache_config)
        self.warmup_time = time.perf_counter() - start
        logger.info("start-up: KV sizing %.2f s, warm-up (compile) %.2f s", self.kv_sizing_time, self.warmup_time)
        self.batch_queue: collections.deque[tuple[SchedulerOutput, AsyncModelRunnerOutput]] = collections.deque()
        self.batch_queue_size = config.num_steps_in_flight
        self.step_fn = self.step_with_batch_queue if self.batch_queue_size > 1 else self.step
        peak = device_peak(jax.devices()[0].device_kind, *config.peaks)
        self.utilization = UtilizationMeter.from_config(
            config.model_config.hf_text_config, config.model_config.dtype, peak
        )
        self.profiler = StepProfiler(utilization=self.utilization) if config.profile_host else NullStepProfiler()
        # As vLLM's worker: last in start-up, so loading and compiling draw nothing after it.
        process_setup.set_random_seed(config.model_config.seed, config.parallel_config.data_parallel_rank)
        # Full collections skip the start-up heap while this engine lives.
        process_setup.engine_started(self)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def make_stats(self) -> SchedulerStats:
        stats = self.scheduler.make_stats()
        utilization = Utilization() if self.utilization is None else self.utilization.take()
        sleep_level = self.sleep_level if self.is_sleeping() else None
        return dataclasses.replace(stats, sleep_level=sleep_level, mbu=utilization.mbu, mfu=utilization.mfu)

    def has_work(self) -> bool:
        """Whether `step_fn` has anything to do: requests to run or to report finished, or a
        dispatched step whose tokens are still to come."""
        return self._has_requests() or bool(self.batch_queue)

    def _has_requests(self) -> bool:
        if self.is_paused:
            return False
        return self.scheduler.has_unfinished_requests() or self.scheduler.has_finished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix block; False (nothing changed) while requests hold blocks."""
        return self.scheduler.reset_prefix_cache()

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's sleep levels: 0 pauses scheduling; 1 and 2 also reset the prefix cache, free
        the KV cache and move the weights to host memory (`Worker.sleep`). `mode="abort"`
        aborts every request first; "keep" (level 0 only) keeps them queued."""
        if level not in SLEEP_LEVELS:
            raise ValueError(f"level must be one of {SLEEP_LEVELS}, got {level!r}.")
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES} (vjx has no 'wait'), got {mode!r}.")
        if mode == "keep" and level > 0:
            raise ValueError(f"mode='keep' keeps requests only at level 0, got level {level}.")
        if mode == "abort":
            self._abort_all()
        self.is_paused = True
        self.sleep_level = level
        if level == 0:
            return
        if not self.reset_prefix_cache():
            raise RuntimeError("sleep could not reset the prefix cache: requests still hold blocks.")
        self.model_executor.sleep(level)

    def _abort_all(self) -> None:
        """Finishes the steps in flight (their outputs are dropped) and aborts every request."""
        while self.batch_queue:
            scheduler_output, future = self.batch_queue.popleft()
            self._update(scheduler_output, self._collect(future))
        self.abort_requests(list(self.scheduler.requests))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Puts back what `tags` name (None: everything); scheduling resumes once the weights
        and the KV cache are both back. Returns whether the engine is fully awake."""
        if tags is not None and any(tag not in WAKE_UP_TAGS for tag in tags):
            raise ValueError(f"tags must be a list of {WAKE_UP_TAGS} or None, got {tags!r}.")
        memory_tags = None if tags is None else [tag for tag in tags if tag != "scheduling"]
        if memory_tags is None or memory_tags:
            self.model_executor.wake_up(memory_tags)
        is_awake = not self.model_executor.is_sleeping
        if is_awake:
            self.is_paused = False
        return is_awake

    def is_sleeping(self) -> bool:
        return self.is_paused or self.model_executor.is_sleeping

    def profile(self, is_start: bool = True, trace_dir: str | None = None) -> None:
        """Starts (into `trace_dir`) or stops the JAX profiler trace of the worker process."""
        self.model_executor.profile(is_start, trace_dir)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        return self.model_executor.collective_rpc(method, timeout, args, kwargs)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Reads the adapter into the workers' host memory ahead of its requests (vLLM's);
        False when it was there already. A bad adapter raises ValueError."""
        return all(self.collective_rpc("add_lora", args=(lora_request,)))

    def remove_lora(self, lora_id: int) -> bool:
        """Forgets the adapter (its requests still running keep it until they finish)."""
        return all(self.collective_rpc("remove_lora", args=(lora_id,)))

    def pin_lora(self, lora_id: int) -> bool:
        return all(self.collective_rpc("pin_lora", args=(lora_id,)))

    def list_loras(self) -> set[int]:
        return self.collective_rpc("list_loras")[0]

    def shutdown(self) -> None:
        """Hands the start-up heap back to the collector unless other engines live; idempotent."""
        self.structured_output_manager.shutdown()
        self.model_executor.shutdown()
        process_setup.engine_stopped(self)

    def step(self) -> EngineCoreOutputs:
        if not self._has_requests():
            return EngineCoreOutputs()
        scheduler_output = self._schedule()
        model_output = self._collect(self._execute(scheduler_output))
        return self._update(scheduler_output, model_output)

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """Async scheduling or pipeline stages: dispatch step N+1 before waiting for step N's tokens.

        Each call dispatches a step when there is work and room in the queue, and returns
        the oldest step's outputs once the queue is full or nothing more can be planned.
        """
        if self._has_requests() and len(self.batch_queue) < self.batch_queue_size:
            scheduler_output = self._schedule()
            if self.batch_queue and self.scheduler.has_structured_output_requests(scheduler_output):
                # Its grammar masks need the tokens of the step in flight: that step ends first.
                outputs = self._finish_oldest()
                self.batch_queue.append((scheduler_output, self._execute(scheduler_output)))
                return outputs
            self.batch_queue.append((scheduler_output, self._execute(scheduler_output)))
            if len(self.batch_queue) < self.batch_queue_size and scheduler_output.total_num_scheduled_tokens:
                return EngineCoreOutputs()
        if not self.batch_queue:
            return EngineCoreOutputs()
        return self._finish_oldest()

    def _finish_oldest(self) -> EngineCoreOutputs:
        scheduler_output, future = self.batch_queue.popleft()
        return self._update(scheduler_output, self._collect(future))

    # The four phases of a step, each timed by the profiler (a no-op without `profile_host`).

    def _schedule(self) -> SchedulerOutput:
        with self.profiler.phase("schedule"):
            return self.scheduler.schedule()

    def _execute(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Dispatches the step (with its grammar masks); its tokens come with `_collect`."""
        with self.profiler.phase("execute"):
            self.scheduler.get_grammar_bitmask(scheduler_output)
            if self.utilization is not None:
                self.utilization.dispatched(scheduler_output)
            return self.model_executor.execute_model(scheduler_output, non_block=True)

    def _collect(self, future: AsyncModelRunnerOutput) -> ModelRunnerOutput:
        with self.profiler.phase("collect"):
            output = future.get_output()
            if self.utilization is not None:
                self.utilization.collected()
            return output

    def _update(self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput) -> EngineCoreOutputs:
        with self.profiler.phase("update"):
            outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        self.profiler.step_done()
        return outputs
