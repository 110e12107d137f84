"""The executor interface: how EngineCore reaches the workers that hold the model."""

import abc

from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.kv_cache_interface import KVCacheConfig
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput


class Executor(abc.ABC):
    def __init__(self, config: VjxConfig):
        self.config = config

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
