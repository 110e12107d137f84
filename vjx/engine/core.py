"""EngineCore: the hub of the engine. `step()` = schedule -> execute -> update."""

import logging
import time

from vjx.config import VjxConfig
from vjx.core.request import Request, RequestStatus
from vjx.core.sched.scheduler import Scheduler
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest
from vjx.executor.abstract import Executor
from vjx.executor.uniproc import UniProcExecutor

logger = logging.getLogger(__name__)


class EngineCore:
    """Owns the scheduler and the executor; knows nothing of text or HTTP."""

    def __init__(self, config: VjxConfig, executor_class: type[Executor] = UniProcExecutor):
        self.config = config
        self.model_executor = executor_class(config)
        self.num_gpu_blocks = self.model_executor.determine_num_available_blocks()
        start = time.perf_counter()
        self.model_executor.initialize(self.num_gpu_blocks)
        self.warmup_time = time.perf_counter() - start
        self.scheduler = Scheduler(config.scheduler_config, config.cache_config, self.num_gpu_blocks)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def step(self) -> EngineCoreOutputs:
        if not (self.scheduler.has_unfinished_requests() or self.scheduler.has_finished_requests()):
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()
        model_output = self.model_executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, model_output)
