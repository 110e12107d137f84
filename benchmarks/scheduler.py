"""Host time of one scheduler step: `schedule()` + `update_from_output()`, no model.

    python -m benchmarks.scheduler --num-requests 256 --num-steps 1000

Every request is running and decoding (one token per step) once the prompts are in; the
runner's outputs are built before the clock starts, so the time is the scheduler's alone.
Measured for the synchronous `Scheduler` and for `AsyncScheduler` (one step in flight).
Prints one table and writes JSON to `--output-json`.
"""

import argparse
import datetime
import statistics
import sys
import time

import numpy as np

from benchmarks import harness
from vjx.config import CacheConfig, SchedulerConfig
from vjx.core.request import Request
from vjx.core.sched.async_scheduler import AsyncScheduler
from vjx.core.sched.output import SchedulerOutput
from vjx.core.sched.scheduler import Scheduler
from vjx.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vjx.outputs import ModelRunnerOutput
from vjx.sampling_params import SamplingParams


def _make_scheduler(args: argparse.Namespace, is_async: bool) -> Scheduler:
    num_tokens = args.prompt_len + args.warmup_steps + args.num_steps + 2
    max_model_len = -(-num_tokens // args.block_size) * args.block_size
    scheduler_config = SchedulerConfig(
        max_num_seqs=args.num_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=is_async,
    )
    cache_config = CacheConfig(
        block_size=args.block_size,
        gpu_memory_utilization=0.9,
        num_gpu_blocks_override=None,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    num_gpu_blocks = args.num_requests * (max_model_len // args.block_size) + 1
    scheduler_class = AsyncScheduler if is_async else Scheduler
    spec = FullAttentionSpec(args.block_size, num_kv_heads=8, head_size=128, dtype="bfloat16")
    kv_cache_config = KVCacheConfig(num_gpu_blocks, (KVCacheGroupSpec(("layers",), spec),))
    scheduler = scheduler_class(scheduler_config, cache_config, kv_cache_config)
    rng = np.random.default_rng(args.seed)
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    for i in range(args.num_requests):
        prompt = rng.integers(0, 32000, size=args.prompt_len).tolist()
        scheduler.add_request(Request(f"r{i}", prompt, params, 2, float(i)))
    return scheduler


def _runner_output(out: SchedulerOutput, token_id: int) -> ModelRunnerOutput:
    """A token for every request whose step reached its end, as the runner reports it."""
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, [[token_id]] * len(req_ids))


def _time_steps(scheduler: Scheduler, num_steps: int, is_async: bool) -> list[float]:
    """Seconds per step; with async scheduling a step's update follows the next schedule."""
    times, in_flight = [], None
    for step in range(num_steps):
        start = time.perf_counter()
        out = scheduler.schedule()
        if in_flight is not None:
            scheduler.update_from_output(*in_flight)
        elapsed = time.perf_counter() - start
        runner_output = _runner_output(out, 100 + step % 1000)
        if is_async:
            in_flight = (out, runner_output)
        else:
            start = time.perf_counter()
            scheduler.update_from_output(out, runner_output)
            elapsed += time.perf_counter() - start
        times.append(elapsed)
    return times


def _warm_up(scheduler: Scheduler, num_steps: int) -> None:
    """Run the prompts in, untimed; the runner samples only at the end of a prompt."""
    for _ in range(num_steps):
        out = scheduler.schedule()
        done = {r for r in out.num_scheduled_tokens if _has_reached_end(scheduler, r)}
        req_ids = list(out.num_scheduled_tokens)
        sampled = [[7] if r in done else [] for r in req_ids]
        runner_output = ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)
        scheduler.update_from_output(out, runner_output)


def _has_reached_end(scheduler: Scheduler, req_id: str) -> bool:
    request = scheduler.requests[req_id]
    return request.num_computed_tokens == request.num_tokens


def _time_allocate_slots(scheduler: Scheduler, num_rounds: int) -> float:
    """Median ms of one `allocate_slots` call per running request: the KV manager's share.

    Each request asks again for the slot of its next token; after the first round (untimed)
    it holds that slot, so every timed round does the same work.
    """
    manager, running = scheduler.kv_cache_manager, list(scheduler.running)
    times = []
    for round_index in range(num_rounds + 1):
        start = time.perf_counter()
        for request in running:
            manager.allocate_slots(request, 1)
        if round_index:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run(args: argparse.Namespace) -> dict:
    results = {}
    for name, is_async in (("sync", False), ("async", True)):
        scheduler = _make_scheduler(args, is_async)
        # One step at a time (none in flight), which the async scheduler runs like the sync one.
        _warm_up(scheduler, args.warmup_steps)
        if len(scheduler.running) != args.num_requests:
            raise ValueError(f"warmup_steps={args.warmup_steps} must be enough to admit every request.")
        times_ms = [t * 1e3 for t in _time_steps(scheduler, args.num_steps, is_async)]
        results[name] = {
            "median_ms": statistics.median(times_ms),
            "p90_ms": float(np.percentile(times_ms, 90)),
            "p99_ms": float(np.percentile(times_ms, 99)),
            "mean_ms": statistics.fmean(times_ms),
            "num_preemptions": scheduler.num_preemptions,
            "allocate_slots_ms": _time_allocate_slots(scheduler, num_rounds=100),
        }
    return {
        "date": datetime.date.today().isoformat(),
        "host": harness.host_description(),
        "command": " ".join(["python -m benchmarks.scheduler"] + sys.argv[1:]),
        **{k: v for k, v in vars(args).items() if k != "output_json"},
        "results": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--num-steps", type=int, default=1000)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    result = run(args)
    harness.print_table(
        [
            f"scheduler ({result['num_requests']} running, {result['num_steps']} steps)",
            "median ms",
            "p90 ms",
            "p99 ms",
            "of which allocate_slots, ms",
        ],
        [
            [name, f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", f"{r['p99_ms']:.3f}", f"{r['allocate_slots_ms']:.3f}"]
            for name, r in result["results"].items()
        ],
    )
    harness.write_json(args.output_json, result)


if __name__ == "__main__":
    main()
