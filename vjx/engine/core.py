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
from vjx.engine.step_profiler import StepProfiler
from vjx.executor.abstract import Executor
from vjx.executor.uniproc import UniProcExecutor
from vjx.outputs import AsyncModelRunnerOutput

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
        self.num_gpu_blocks = self.model_executor.determine_num_available_blocks()
        # On devices with memory statistics, sizing loads or compiles the largest step.
        self.kv_sizing_time = time.perf_counter() - start
        start = time.perf_counter()
        self.model_executor.initialize(self.num_gpu_blocks)
        self.warmup_time = time.perf_counter() - start
        logger.info("start-up: KV sizing %.2f s, warm-up (compile) %.2f s", self.kv_sizing_time, self.warmup_time)
        is_async = config.scheduler_config.async_scheduling
        scheduler_class = AsyncScheduler if is_async else Scheduler
        self.scheduler = scheduler_class(config.scheduler_config, config.cache_config, self.num_gpu_blocks)
        self.batch_queue: collections.deque[tuple[SchedulerOutput, AsyncModelRunnerOutput]] = collections.deque()
        self.step_fn = self.step_with_batch_queue if is_async else self.step
        self.profiler = StepProfiler() if config.profile_host else None
        if self.profiler is not None:
            self._profile_steps(self.profiler)
        # Full collections skip the start-up heap while this engine lives.
        process_setup.engine_started(self)

    def _profile_steps(self, profiler: StepProfiler) -> None:
        """Times the scheduler's and the executor's calls (see step_profiler.py)."""
        scheduler, executor = self.scheduler, self.model_executor
        scheduler.schedule = profiler.timed("schedule", scheduler.schedule)
        update = profiler.timed("update", scheduler.update_from_output)

        def update_and_count(scheduler_output, model_output):
            outputs = update(scheduler_output, model_output)
            profiler.step_done()
            return outputs

        scheduler.update_from_output = update_and_count
        execute = profiler.timed("execute", executor.execute_model)

        def execute_and_time_collect(scheduler_output, non_block: bool = False):
            future = execute(scheduler_output, non_block=True)
            future = AsyncModelRunnerOutput(profiler.timed("collect", future.get_output))
            return future if non_block else future.get_output()

        executor.execute_model = execute_and_time_collect

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def make_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def _has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self.scheduler.has_finished_requests()

    def shutdown(self) -> None:
        """Hands the start-up heap back to the collector unless other engines live; idempotent."""
        process_setup.engine_stopped(self)

    def step(self) -> EngineCoreOutputs:
        if not self._has_work():
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()
        model_output = self.model_executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, model_output)

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """Async scheduling: dispatch step N+1 before waiting for step N's tokens.

        Each call dispatches a step when there is work and room in the queue, and returns
        the oldest step's outputs once the queue is full or nothing more can be planned.
        """
        if self._has_work() and len(self.batch_queue) < _BATCH_QUEUE_SIZE:
            scheduler_output = self.scheduler.schedule()
            future = self.model_executor.execute_model(scheduler_output, non_block=True)
            self.batch_queue.append((scheduler_output, future))
            if len(self.batch_queue) < _BATCH_QUEUE_SIZE and scheduler_output.total_num_scheduled_tokens:
                return EngineCoreOutputs()
        if not self.batch_queue:
            return EngineCoreOutputs()
        scheduler_output, future = self.batch_queue.popleft()
        return self.scheduler.update_from_output(scheduler_output, future.get_output())
