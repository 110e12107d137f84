"""Worker: owns the mesh, the params, the KV cache and the model runner of one engine replica.

The replica's devices form a mesh (vjx/sharding/mesh.py); one Python process drives all of
them. Params and the KV cache are sharded over `model` by the rules table (the cache over KV
heads, in the attention backend's own layout), and attention runs per device on its heads.
"""

import logging
import time

import jax
import jax.numpy as jnp

from vjx.attention.backend import get_attention_backend
from vjx.attention.sharded import ShardedBackend
from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.models.loader import get_model
from vjx.models.registry import get_kv_cache_spec
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.sharding.mesh import make_mesh
from vjx.sharding.placement import filled
from vjx.sharding.rules import logical_sharding
from vjx.worker.executable_cache import ExecutableCache
from vjx.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Hosts without device memory statistics (the CPU backend) get a fixed KV cache budget per
# device, like vLLM's CPU backend.
_HOST_KV_CACHE_BYTES = 4 << 30


class Worker:
    """Loads the model, sizes and allocates the paged KV cache, and runs steps."""

    def __init__(self, config: VjxConfig):
        self.config = config
        self.mesh = make_mesh(config.parallel_config)
        self.backend = get_attention_backend(config.attention_backend)
        start = time.perf_counter()
        self.model = get_model(config.model_config, ShardedBackend(self.backend), mesh=self.mesh)
        self.load_time = time.perf_counter() - start
        logger.info("loaded %s in %.1f s on %d device(s)", config.model_config.model, self.load_time,
                    self.mesh.size)
        tp = config.parallel_config.tensor_parallel_size
        self.kv_cache_spec = get_kv_cache_spec(config.model_config.hf_config, tp)
        self.kv_cache_sharding = logical_sharding(self.mesh, self.backend.kv_cache_axes)
        self.model_runner: ModelRunner | None = None
        self.executable_cache = ExecutableCache.in_compilation_cache_dir(config, self.mesh)

    @property
    def _kv_dtype(self):
        return jnp.dtype(self.config.model_config.dtype)

    def _kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.kv_cache_spec
        return self.backend.kv_cache_shape(
            num_blocks, self.config.cache_config.block_size, spec.num_kv_heads, spec.head_dim
        )

    def get_kv_block_bytes(self) -> int:
        """Bytes one KV block takes over all layers, on one device (its share of the heads)."""
        per_layer = self._kv_dtype.itemsize
        for dim in self._kv_cache_shape(1):
            per_layer *= dim
        return per_layer * self.kv_cache_spec.num_layers // self.mesh.size

    def determine_num_available_blocks(self) -> int:
        """KV blocks that fit the memory left after weights and activations, on the fullest
        device of the mesh."""
        cache_config = self.config.cache_config
        if cache_config.num_gpu_blocks_override is not None:
            return cache_config.num_gpu_blocks_override
        all_stats = [device.memory_stats() for device in self.mesh.devices.flat]
        if any(stats is None for stats in all_stats):
            budget = _HOST_KV_CACHE_BYTES
        else:
            budget = min(stats["bytes_limit"] * cache_config.gpu_memory_utilization - stats["bytes_in_use"]
                         for stats in all_stats)
            budget -= self._activation_bytes()
        num_blocks = int(budget // self.get_kv_block_bytes())
        if num_blocks < 2:
            raise ValueError(
                "no memory is left for the KV cache: raise gpu_memory_utilization "
                f"(now {cache_config.gpu_memory_utilization}) or lower max_num_batched_tokens."
            )
        return num_blocks

    def _activation_bytes(self) -> int:
        """Scratch memory of the largest step on one device, from XLA's memory analysis of a
        tiny-cache compile."""
        runner = ModelRunner(self.config, self.model, self._allocate_kv_caches(2), self.mesh)
        largest = max(runner.layouts)
        stats = runner.compile_layout(largest, executable_cache=self.executable_cache).memory_analysis()
        return int(stats.temp_size_in_bytes)

    def _allocate_kv_caches(self, num_blocks: int) -> list[jax.Array]:
        """One zeroed cache array per layer, created sharded over KV heads on the mesh."""
        shape = self._kv_cache_shape(num_blocks)
        return [filled(shape, self._kv_dtype, 0, self.kv_cache_sharding)
                for _ in range(self.kv_cache_spec.num_layers)]

    def initialize_cache(self, num_blocks: int) -> None:
        logger.info("KV cache: %d blocks of %d tokens", num_blocks, self.config.cache_config.block_size)
        self.model_runner = ModelRunner(self.config, self.model, self._allocate_kv_caches(num_blocks), self.mesh)

    def compile_or_warm_up_model(self) -> float:
        elapsed = self.model_runner.compile_or_warm_up_model(self.executable_cache)
        if self.executable_cache is not None:
            logger.info("executable cache %s: %d loaded, %d compiled", self.executable_cache.directory,
                        self.executable_cache.num_hits, self.executable_cache.num_misses)
        return elapsed

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output, non_block)
