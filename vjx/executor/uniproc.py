"""UniProcExecutor: one Python controller drives the whole local device set."""

from collections.abc import Callable
from typing import Any

from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.executor.abstract import Executor
from vjx.kv_cache_interface import KVCacheConfig
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: VjxConfig):
        super().__init__(config)
        self.worker = Worker(config)

    def determine_kv_cache_config(self) -> KVCacheConfig:
        return self.worker.determine_kv_cache_config()

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> float:
        self.worker.initialize_from_config(kv_cache_config)
        return self.worker.compile_or_warm_up_model()

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.worker.execute_model(scheduler_output, non_block)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """The one worker's result, as a list; the call runs in this thread, so `timeout`
        (kept for vLLM's signature) cannot interrupt it."""
        kwargs = kwargs or {}
        if isinstance(method, str):
            return [getattr(self.worker, method)(*args, **kwargs)]
        return [method(self.worker, *args, **kwargs)]
