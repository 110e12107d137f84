"""EngineCore: the hub of the engine. `step()` = schedule -> execute -> update."""

import collections
import logging
import time

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
from vjx.executor.uniproc import UniProcExecutor
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

logger = logging.getLogger(__name__)

# Steps in flight with async scheduling: the one the device runs and the one planned next.
_BATCH_QUEUE_SIZE = 2


class EngineCore:
    """Owns the scheduler and the executor; knows nothing of text or HTTP."""

    def __init__(self, config: VjxConfig, executor_class: type[Executor] = UniProcExecutor):
        # Engines dropped since an earlier one started must free their memory before this
        # one measures what is free; the persistent compilation cache is on for every engine.
        process_setup.engine_starting()
        self.config = config
        self.model_executor = executor_class(config)
        start = time.perf_counter()
        kv_cache_config = self.model_executor.determine_kv_cache_config()
        # On devices with memory statistics, sizing loads or compiles the largest step.
        self.kv_sizing_time = time.perf_counter() - start
        self.num_gpu_blocks = kv_cache_config.num_blocks
        is_async = config.scheduler_config.async_scheduling
        scheduler_class = AsyncScheduler if is_async else Scheduler
        # Before the warm-up: a pool too small for its groups is refused without compiling.
        self.scheduler = scheduler_class(config.scheduler_config, config.cache_config, kv_cache_config)
        start = time.perf_counter()
        self.model_executor.initialize_from_config(kv_cache_config)
        self.warmup_time = time.perf_counter() - start
        logger.info("start-up: KV sizing %.2f s, warm-up (compile) %.2f s", self.kv_sizing_time, self.warmup_time)
        self.batch_queue: collections.deque[tuple[SchedulerOutput, AsyncModelRunnerOutput]] = collections.deque()
        self.step_fn = self.step_with_batch_queue if is_async else self.step
        self.profiler = StepProfiler() if config.profile_host else NullStepProfiler()
        # Full collections skip the start-up heap while this engine lives.
        process_setup.engine_started(self)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def make_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def has_work(self) -> bool:
        """Whether `step_fn` has anything to do: requests to run or to report finished, or a
        dispatched step whose tokens are still to come."""
        return self._has_requests() or bool(self.batch_queue)

    def _has_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self.scheduler.has_finished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix block; False (nothing changed) while requests hold blocks."""
        return self.scheduler.reset_prefix_cache()

    def shutdown(self) -> None:
        """Hands the start-up heap back to the collector unless other engines live; idempotent."""
        process_setup.engine_stopped(self)

    def step(self) -> EngineCoreOutputs:
        if not self._has_requests():
            return EngineCoreOutputs()
        scheduler_output = self._schedule()
        model_output = self._collect(self._execute(scheduler_output))
        return self._update(scheduler_output, model_output)

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """Async scheduling: dispatch step N+1 before waiting for step N's tokens.

        Each call dispatches a step when there is work and room in the queue, and returns
        the oldest step's outputs once the queue is full or nothing more can be planned.
        """
        if self._has_requests() and len(self.batch_queue) < _BATCH_QUEUE_SIZE:
            scheduler_output = self._schedule()
            self.batch_queue.append((scheduler_output, self._execute(scheduler_output)))
            if len(self.batch_queue) < _BATCH_QUEUE_SIZE and scheduler_output.total_num_scheduled_tokens:
                return EngineCoreOutputs()
        if not self.batch_queue:
            return EngineCoreOutputs()
        scheduler_output, future = self.batch_queue.popleft()
        return self._update(scheduler_output, self._collect(future))

    # The four phases of a step, each timed by the profiler (a no-op without `profile_host`).

    def _schedule(self) -> SchedulerOutput:
        with self.profiler.phase("schedule"):
            return self.scheduler.schedule()

    def _execute(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Dispatches the step; its tokens come with `_collect`."""
        with self.profiler.phase("execute"):
            return self.model_executor.execute_model(scheduler_output, non_block=True)

    def _collect(self, future: AsyncModelRunnerOutput) -> ModelRunnerOutput:
        with self.profiler.phase("collect"):
            return future.get_output()

    def _update(self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput) -> EngineCoreOutputs:
        with self.profiler.phase("update"):
            outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        self.profiler.step_done()
        return outputs
