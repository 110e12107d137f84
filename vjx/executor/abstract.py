"""The executor interface: how EngineCore reaches the workers that hold the model."""

import abc
from collections.abc import Callable
from typing import Any

from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.kv_cache_interface import KVCacheConfig
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput


class Executor(abc.ABC):
    def __init__(self, config: VjxConfig):
        self.config = config

    @staticmethod
    def get_class(config: VjxConfig) -> type["Executor"]:
        """One process drives every device ("uni"), or rank 0 of several ("mp", nnodes > 1)."""
        if config.parallel_config.nnodes > 1:
            from vjx.executor.multiproc import MultiprocExecutor

            return MultiprocExecutor
        from vjx.executor.uniproc import UniProcExecutor

        return UniProcExecutor

    @abc.abstractmethod
    def determine_kv_cache_config(self) -> KVCacheConfig:
        """The model's layers grouped by KV cache spec, and the blocks the pool can hold."""

    @abc.abstractmethod
    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> float:
        """Allocates the KV cache and compiles every step variant; returns compile seconds."""

    @abc.abstractmethod
    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Runs one step; with `non_block` returns at dispatch, before the tokens are known."""

    @abc.abstractmethod
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Calls a worker method by name, or `method(worker, *args, **kwargs)`, on every
        worker; returns their results in worker order."""

    @property
    def is_sleeping(self) -> bool:
        return any(self.collective_rpc(lambda worker: worker.is_sleeping))

    def sleep(self, level: int = 1) -> None:
        self.collective_rpc("sleep", args=(level,))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.collective_rpc("wake_up", args=(tags,))

    def shutdown(self) -> None:
        """Releases what the executor holds beyond this process (other ranks); idempotent.
        One process holds nothing beyond itself."""
        return None

    def profile(self, is_start: bool = True, trace_dir: str | None = None) -> None:
        self.collective_rpc("profile", args=(is_start, trace_dir))
