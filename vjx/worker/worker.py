"""Worker: owns the mesh, the params, the KV cache and the model runner of one engine replica.

The replica's devices form a mesh (vjx/sharding/mesh.py); one Python process drives all of
them. Params and the KV cache are sharded over `model` by the rules table (the cache over KV
heads, in the attention backend's own layout), and attention runs per device on its heads.
The cache's element type is the model dtype, or float8_e4m3fn for `kv_cache_dtype="fp8"`
(one byte an element: twice the blocks in the same memory).
"""

import logging
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vjx.attention.backend import get_attention_backend
from vjx.attention.sharded import ShardedBackend
from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.kv_cache_interface import (
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    get_kv_cache_groups,
    kv_cache_dtype_name,
)
from vjx.lora.layers import add_lora
from vjx.lora.request import LoRARequest
from vjx.lora.worker_manager import LoRAManager
from vjx.models import orbax_checkpoint
from vjx.models.loader import get_model
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.sharding.mesh import make_stage_meshes
from vjx.sharding.pipeline import stage_layer_ranges
from vjx.sharding.placement import filled, num_cache_kv_heads
from vjx.sharding.rules import logical_sharding
from vjx.spec_decode.config import EAGLE_METHODS
from vjx.worker import weight_update
from vjx.worker.executable_cache import ExecutableCache
from vjx.worker.kv_cache_layout import kv_cache_axes, kv_cache_shape
from vjx.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Hosts without device memory statistics (the CPU backend) get at most this KV cache budget
# per device, like vLLM's CPU backend.
_HOST_KV_CACHE_BYTES = 4 << 30


class Worker:
    """Loads the model, sizes and allocates the paged KV cache, and runs steps."""

    def __init__(self, config: VjxConfig):
        self.config = config
        # With pipeline stages, `mesh` (the step's replicated state, sampling) is the last's.
        self.stage_meshes = make_stage_meshes(config.parallel_config)
        self.mesh = self.stage_meshes[-1]
        self.backend = get_attention_backend(config.attention_backend)
        start = time.perf_counter()
        self.model = get_model(
            config.model_config,
            ShardedBackend(self.backend),
            mesh=self.stage_meshes[0],
            enable_expert_parallel=config.parallel_config.enable_expert_parallel,
            stage_meshes=self.stage_meshes,
        )
        if config.lora_config is not None:
            _add_lora(self.model, config)
        self.load_time = time.perf_counter() - start
        logger.info("loaded %s in %.1f s on %d device(s)", config.model_config.model, self.load_time, self.mesh.size)
        self.kv_cache_specs = self.get_kv_cache_spec()
        self.kv_cache_groups = get_kv_cache_groups(self.kv_cache_specs)
        has_state_layers = any(isinstance(spec, MambaSpec) for spec in self.kv_cache_specs.values())
        self.num_state_slots = config.scheduler_config.max_num_seqs + 1 if has_state_layers else 0
        """A state slot per running request and the scratch slot 0, for state-space layers."""
        _check_speculation(config, self.kv_cache_specs)
        self.draft_model, self.draft_kv_cache_specs = self._load_draft_model()
        self.layer_ranges = stage_layer_ranges(len(self.kv_cache_specs), len(self.stage_meshes))
        specs = list(self.kv_cache_specs.values())
        self.kv_cache_shardings = [
            logical_sharding(self.stage_meshes[stage], kv_cache_axes(self.backend, specs[i]))
            for stage, layers in enumerate(self.layer_ranges)
            for i in layers
        ]
        self.model_runner: ModelRunner | None = None
        self.kv_cache_config: KVCacheConfig | None = None
        self.host_weights: list[np.ndarray] | None = None
        """The weights while asleep at level 1 or 2 (their device arrays are deleted)."""
        self.executable_cache = ExecutableCache.in_compilation_cache_dir(config, self.mesh)

    @property
    def kv_cache_dtype(self) -> str:
        """The cache's element type, by name: the model dtype (float32 on the CPU), or
        float8_e4m3fn for "fp8"."""
        platform = self.mesh.devices.flat[0].platform
        return kv_cache_dtype_name(self.config.cache_config.cache_dtype, self.config.model_config.dtype, platform)

    @property
    def _kv_dtype(self):
        return jnp.dtype(self.kv_cache_dtype)

    def get_kv_cache_spec(self, model: nnx.Module | None = None, model_config=None) -> dict[str, KVCacheSpec]:
        """Each attention layer's spec, in model order (of the target, or of `model`). With
        fewer KV heads than `tensor_parallel_size`, the loader repeats each head so that every
        device holds one (vjx/sharding/placement.py); the cache holds the repeated heads."""
        hf_config = (model_config or self.config.model_config).hf_text_config
        num_heads = getattr(hf_config, "num_attention_heads", 1)  # none in a state-space model
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
        num_kv_heads = num_cache_kv_heads(num_kv_heads, self.config.parallel_config.tensor_parallel_size)
        block_size = self.config.cache_config.block_size
        return (model or self.model).get_kv_cache_spec(block_size, num_kv_heads, self.kv_cache_dtype)

    def _load_draft_model(self) -> tuple[nnx.Module | None, dict[str, KVCacheSpec]]:
        """Speculative decoding's draft model (on the target's mesh) and its layers' KV specs,
        which must be the one kind of the target's single KV cache group (the draft's cache
        takes the target's blocks)."""
        spec = self.config.speculative_config
        if spec is None or spec.draft_model_config is None:
            return None, {}
        is_head = spec.method in EAGLE_METHODS
        model = get_model(spec.draft_model_config, ShardedBackend(self.backend), mesh=self.mesh, is_draft_head=is_head)
        specs = self.get_kv_cache_spec(model, spec.draft_model_config)
        group_spec = self.kv_cache_groups[0].kv_cache_spec
        if len(self.kv_cache_groups) > 1 or any(type(s) is not type(group_spec) for s in specs.values()):
            raise ValueError(
                "speculative_config method='draft_model' needs a target with one KV cache group and a draft "
                "model of the same attention kind (sliding windows on either side are not built yet)."
            )
        logger.info("loaded the draft model %s", spec.draft_model_config.model)
        return model, specs

    def _kv_cache_shape(self, spec: KVCacheSpec, num_blocks: int) -> tuple[int, ...]:
        return kv_cache_shape(self.backend, spec, num_blocks, num_state_slots=self.num_state_slots)

    def _cache_bytes(self, spec: KVCacheSpec, num_blocks: int, sharding) -> int:
        """Bytes of one layer's cache on each device holding it (a replicated one whole)."""
        return self._kv_dtype.itemsize * math.prod(sharding.shard_shape(self._kv_cache_shape(spec, num_blocks)))

    def _fullest_stage_bytes(self, num_blocks: int) -> int:
        """Bytes the caches of `num_blocks` blocks take on the fullest device: its stage's
        layers (and a draft model's, which takes the same blocks; pipeline stages and a draft
        model are exclusive), its share of their heads."""
        items = list(zip(self.kv_cache_specs.values(), self.kv_cache_shardings, strict=True))
        per_stage = [
            sum(self._cache_bytes(items[i][0], num_blocks, items[i][1]) for i in layers) for layers in self.layer_ranges
        ]
        draft_sharding = self.kv_cache_shardings[0]
        draft = sum(self._cache_bytes(s, num_blocks, draft_sharding) for s in self.draft_kv_cache_specs.values())
        return max(per_stage) + draft

    def get_kv_block_bytes(self) -> int:
        """Bytes one more KV block id takes on the fullest device (0 for a model whose caches
        are all state slots)."""
        return self._fullest_stage_bytes(1) - self._fullest_stage_bytes(0)

    def get_state_bytes(self) -> int:
        """Bytes the state-space layers' slots take on the fullest device, whatever the blocks."""
        return self._fullest_stage_bytes(0)

    def determine_kv_cache_config(self) -> KVCacheConfig:
        """The layers grouped by spec, and as many blocks as the memory left holds."""
        return KVCacheConfig(self.determine_num_available_blocks(), self.kv_cache_groups, self.num_state_slots)

    def determine_num_available_blocks(self) -> int:
        """KV blocks that fit `kv_cache_memory_bytes`, else the memory left after weights and
        activations on the fullest device of the mesh this process drives; on a host without memory statistics
        (the CPU), what `max_num_seqs` requests of `max_model_len` tokens need, at most 4 GiB."""
        cache_config = self.config.cache_config
        if cache_config.num_gpu_blocks_override is not None:
            return cache_config.num_gpu_blocks_override
        block_bytes = self.get_kv_block_bytes()
        if block_bytes == 0:
            return 2  # only state slots: the block pool holds the null block and one unused
        # This process's devices (over several processes, each sizes its own; rank 0 takes the least).
        all_stats = [device.memory_stats() for mesh in self.stage_meshes for device in mesh.local_devices]
        if cache_config.kv_cache_memory_bytes is not None:
            budget = cache_config.kv_cache_memory_bytes - self.get_state_bytes()
        elif any(stats is None for stats in all_stats):
            budget = min(_HOST_KV_CACHE_BYTES, self._max_num_seqs_blocks() * block_bytes)
        else:
            budget = min(
                stats["bytes_limit"] * cache_config.gpu_memory_utilization - stats["bytes_in_use"]
                for stats in all_stats
            )
            budget -= self._activation_bytes() + self.get_state_bytes()
        num_blocks = int(budget // block_bytes)
        if num_blocks < 2:
            raise ValueError(
                "no memory is left for the KV cache: raise gpu_memory_utilization "
                f"(now {cache_config.gpu_memory_utilization}) or kv_cache_memory_bytes "
                f"(now {cache_config.kv_cache_memory_bytes}), or lower max_num_batched_tokens."
            )
        return num_blocks

    def _max_num_seqs_blocks(self) -> int:
        """Blocks `max_num_seqs` requests of `max_model_len` tokens hold at once, and block 0."""
        sched = self.config.scheduler_config
        per_request = KVCacheConfig(2, self.kv_cache_groups, self.num_state_slots).max_num_blocks_per_request(
            sched.max_model_len, sched.max_num_batched_tokens
        )
        return sched.max_num_seqs * per_request + 1

    def _activation_bytes(self) -> int:
        """Scratch memory of the largest step on one device, from XLA's memory analysis of a
        tiny-cache compile."""
        kv_cache_config = KVCacheConfig(2, self.kv_cache_groups, self.num_state_slots)
        caches = self._allocate_kv_caches(2)
        runner = ModelRunner(self.config, self.model, caches, self.mesh, kv_cache_config, self.stage_meshes)
        largest = max(runner.layouts)
        stats = runner.compile_layout(largest, executable_cache=self.executable_cache).memory_analysis()
        return int(stats.temp_size_in_bytes)

    def _allocate_kv_caches(self, num_blocks: int) -> dict[str, jax.Array]:
        """One zeroed cache array per layer, created sharded over KV heads on its stage's mesh."""
        return {
            name: filled(self._kv_cache_shape(spec, num_blocks), self._kv_dtype, 0, sharding)
            for (name, spec), sharding in zip(self.kv_cache_specs.items(), self.kv_cache_shardings, strict=True)
        }

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        num_blocks = kv_cache_config.num_blocks
        self.kv_cache_config = kv_cache_config
        logger.info(
            "KV cache: %d blocks of %d tokens in %d group(s)",
            num_blocks,
            kv_cache_config.block_size,
            len(kv_cache_config.kv_cache_groups),
        )
        draft = None
        if self.draft_model is not None:
            sharding = self.kv_cache_shardings[0]
            caches = [
                filled(self._kv_cache_shape(s, num_blocks), self._kv_dtype, 0, sharding)
                for s in self.draft_kv_cache_specs.values()
            ]
            draft = (self.draft_model, caches)
        self.model_runner = ModelRunner(
            self.config,
            self.model,
            self._allocate_kv_caches(num_blocks),
            self.mesh,
            kv_cache_config,
            self.stage_meshes,
            draft,
        )

    def compile_or_warm_up_model(self) -> float:
        elapsed = self.model_runner.compile_or_warm_up_model(self.executable_cache)
        if self.executable_cache is not None:
            logger.info(
                "executable cache %s: %d loaded, %d compiled",
                self.executable_cache.directory,
                self.executable_cache.num_hits,
                self.executable_cache.num_misses,
            )
        return elapsed

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output, non_block)

    @property
    def is_sleeping(self) -> bool:
        return self.host_weights is not None or self.model_runner.kv_caches is None

    def sleep(self, level: int = 1) -> None:
        """Frees the KV cache's device buffers and moves the weights to host memory (numpy),
        deleting their device arrays. vLLM's level 2 discards the weights; vjx keeps the host
        copy at both levels, so `wake_up` needs no reload."""
        runner = self.model_runner
        if runner.kv_caches is not None:
            for kv_cache in runner.kv_caches:
                kv_cache.delete()
            runner.kv_caches = None
        if self.host_weights is None:
            self.weight_shardings = [leaf.sharding for leaf in runner.param_leaves]
            self.host_weights = jax.device_get(runner.param_leaves)
            for leaf in runner.param_leaves:
                leaf.delete()
        logger.info("asleep (level %d): KV cache freed, weights in host memory", level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Puts back what `sleep` took: "weights" (same shardings, so no step recompiles)
        and "kv_cache" (a zeroed pool of the same size); None means both."""
        tags = ("weights", "kv_cache") if tags is None else tags
        runner = self.model_runner
        if "weights" in tags and self.host_weights is not None:
            leaves = [jax.device_put(w, s) for w, s in zip(self.host_weights, self.weight_shardings)]
            runner.param_leaves = leaves
            # The model's own leaves (a pipeline's stage copies of a tied embedding follow them).
            nnx.update(self.model, jax.tree.unflatten(runner.treedef, leaves[: runner.treedef.num_leaves]))
            self.host_weights = None
        if "kv_cache" in tags and runner.kv_caches is None:
            runner.kv_caches = list(self._allocate_kv_caches(self.kv_cache_config.num_blocks).values())

    def profile(self, is_start: bool = True, trace_dir: str | None = None) -> None:
        """Starts or stops a JAX profiler trace of this process, written under `trace_dir`
        (a `dp<rank>` folder of it with several data-parallel replicas)."""
        if not is_start:
            jax.profiler.stop_trace()
            return
        parallel_config = self.config.parallel_config
        if parallel_config.data_parallel_size > 1:
            trace_dir = os.path.join(trace_dir, f"dp{parallel_config.data_parallel_rank}")
        jax.profiler.start_trace(trace_dir)

    def apply_model(self, func):
        """`func(model)` on this worker's Flax NNX model."""
        return func(self.model)

    def get_weights(self) -> dict:
        """The model's params, vjx's layout (vjx/worker/weight_update.py)."""
        return weight_update.get_weights(self.model)

    def update_weights(self, weights) -> int:
        """New values for the model's params, in vjx's layout or by checkpoint name; the
        compiled steps take them as they are. Returns how many params changed."""
        self._check_weights_in_place("update_weights")
        num_changed = weight_update.update_weights(self.model, self.config.model_config, weights, self.stage_meshes[0])
        self._reread_params()
        return num_changed

    def reload_weights(self, path: str) -> int:
        """Every param again from the safetensors files in directory `path`."""
        self._check_weights_in_place("reload_weights")
        num_changed = weight_update.reload_weights(self.model, self.config.model_config, path, self.stage_meshes[0])
        self._reread_params()
        return num_changed

    def _reread_params(self) -> None:
        """The runner's step arguments after the model's params were replaced (same shapes)."""
        self.model_runner.param_leaves = jax.tree.leaves(nnx.state(self.model))

    def save_weights(self, path: str) -> None:
        """An Orbax checkpoint of the params and the model's small files (replica 0 writes it)."""
        if self.config.parallel_config.data_parallel_rank == 0:
            orbax_checkpoint.save_weights(self.get_weights(), path, self.config.model_config.model)

    def _check_weights_in_place(self, method: str) -> None:
        if self.config.parallel_config.pipeline_parallel_size > 1:
            raise ValueError(f"{method} with pipeline_parallel_size > 1 is not built yet.")
        if self.is_sleeping:
            raise RuntimeError(f"{method} needs an awake engine: call wake_up() first.")

    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self._lora_manager().add_adapter(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._lora_manager().remove_adapter(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self._lora_manager().pin_adapter(lora_id)

    def list_loras(self) -> set[int]:
        return self._lora_manager().list_adapters()

    def _lora_manager(self) -> LoRAManager:
        if self.model_runner.lora is None:
            raise ValueError("LoRA adapters need an engine started with enable_lora=True.")
        return self.model_runner.lora


def _check_speculation(config: VjxConfig, kv_cache_specs: dict[str, KVCacheSpec]) -> None:
    """Speculative decoding needs every layer to take back rejected drafts: a KV cache just
    ignores their slots, but a state-space layer has already folded them into its state."""
    if config.speculative_config is None:
        return
    state_layers = [name for name, spec in kv_cache_specs.items() if isinstance(spec, MambaSpec)]
    if state_layers:
        raise ValueError(
            f"speculative_config with a model of state-space (Mamba) layers ({state_layers[0]}, ...) is not "
            "built yet: a rejected draft token would stay in the layer's state. Leave speculative_config unset."
        )


def _add_lora(model: nnx.Module, config: VjxConfig) -> None:
    """The model's LoRA slots (`enable_lora`), where the rest of the engine can run them."""
    if config.speculative_config is not None or config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError(
            "enable_lora with speculative_config or pipeline_parallel_size > 1 is not built yet; "
            "LoRA runs with tensor and data parallelism only."
        )
    lora = config.lora_config
    add_lora(model, max_loras=lora.max_loras, max_lora_rank=lora.max_lora_rank, dtype=config.model_config.dtype)
