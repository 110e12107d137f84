"""Builders shared by the scheduler tests: a tiny KV config, requests, hand-built runner outputs."""

from vjx.config import CacheConfig, SchedulerConfig
from vjx.core.request import Request
from vjx.core.sched.async_scheduler import AsyncScheduler
from vjx.core.sched.output import SchedulerOutput
from vjx.core.sched.scheduler import Scheduler
from vjx.engine.messages import EngineCoreOutput
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
from vjx.outputs import ModelRunnerOutput
from vjx.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_scheduler(
    *,
    num_gpu_blocks: int = 17,
    max_model_len: int = 32,
    max_num_batched_tokens: int = 32,
    max_num_seqs: int = 4,
    enable_chunked_prefill: bool = True,
    enable_prefix_caching: bool = True,
    long_prefill_token_threshold: int = 0,
    policy: str = "fcfs",
    async_scheduling: bool = False,
    kv_cache_spec: KVCacheSpec | None = None,
) -> Scheduler:
    """Blocks of 4 tokens; block 0 is reserved, so 17 blocks give 16 usable ones. One KV cache
    group, of full attention unless `kv_cache_spec` says otherwise."""
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold,
        scheduling_policy=policy,
        async_scheduling=async_scheduling,
    )
    cache_config = CacheConfig(
        block_size=BLOCK_SIZE,
        gpu_memory_utilization=0.9,
        num_gpu_blocks_override=None,
        enable_prefix_caching=enable_prefix_caching,
    )
    scheduler_class = AsyncScheduler if async_scheduling else Scheduler
    spec = kv_cache_spec or FullAttentionSpec(BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype="float32")
    kv_cache_config = KVCacheConfig(num_gpu_blocks, (KVCacheGroupSpec(("layers.0",), spec),))
    return scheduler_class(scheduler_config, cache_config, kv_cache_config)


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    eos_token_id: int | None = None,
    arrival_time: float = 0.0,
    priority: int = 0,
    **sampling_kwargs,
) -> Request:
    sampling_params = SamplingParams(**sampling_kwargs)
    return Request(request_id, prompt_token_ids, sampling_params, eos_token_id, arrival_time, priority)


def runner_output(out: SchedulerOutput, sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    """What the runner returns: a row per scheduled request, tokens only where given."""
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=[sampled.get(req_id, []) for req_id in req_ids],
    )


def step(scheduler: Scheduler, sampled: dict[str, list[int]]):
    """One schedule -> (runner) -> update round; returns both halves."""
    out = scheduler.schedule()
    return out, scheduler.update_from_output(out, runner_output(out, sampled))


def new_reqs(scheduler_output: SchedulerOutput) -> list[tuple]:
    return [(r.req_id, r.block_ids, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]


def free_ids(scheduler: Scheduler) -> list[int]:
    queue = scheduler.kv_cache_manager.block_pool.free_block_queue
    return [block.block_id for block in queue.get_all_free_blocks()]


def num_free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def output(request_id, new_token_ids, finish_reason=None, stop_reason=None, num_cached_tokens=0):
    return EngineCoreOutput(request_id, new_token_ids, finish_reason, stop_reason, num_cached_tokens)
