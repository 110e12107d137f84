"""Host-side cost of the KV cache manager: prefix lookups, allocations and frees.

    python -m benchmarks.kv_cache_manager [--num-requests 1000 --prompt-len 2048 ...]

Drives `KVCacheManager` the way the scheduler does, without a model: `--num-requests`
prompts of `--prompt-len` tokens, the first `--shared-fraction` of each taken from one of
`--num-prefixes` shared prefixes and the rest unique; at most `--max-running` requests in
flight. Each admitted request is looked up in the prefix cache (`get_computed_blocks`, which
also hashes its full blocks), its prompt allocated in chunks of `--prefill-chunk` tokens,
then it decodes `--output-len` tokens (one `allocate_slots` call each) and is freed. The
pool is sized so that nothing is preempted but freed blocks are reused, so cached blocks
are evicted as they would be in a busy server. Each hash function (`--hash-algos`) runs
`--repeats` times. Per operation it reports the median call over all runs (robust when the
host is shared) and the mean of the run with the lowest mean. Prints one table and writes
JSON to `--output-json`.
"""

import argparse
import collections
import datetime
import platform
import random
import statistics
import sys
import time

from benchmarks import harness
from vjx.core.kv_cache_manager import KVCacheManager
from vjx.core.request import Request
from vjx.sampling_params import SamplingParams

_CALLS = ("get_computed_blocks", "allocate_slots (prefill)", "allocate_slots (decode)", "free")


def _make_requests(args: argparse.Namespace) -> list[Request]:
    rng = random.Random(args.seed)
    num_shared = int(args.prompt_len * args.shared_fraction)
    prefixes = [[rng.randrange(50_000) for _ in range(num_shared)] for _ in range(args.num_prefixes)]
    params = SamplingParams(max_tokens=args.output_len)
    requests = []
    for i in range(args.num_requests):
        unique = [rng.randrange(50_000) for _ in range(args.prompt_len - num_shared)]
        prompt = prefixes[i % args.num_prefixes] + unique
        requests.append(Request(f"r{i}", prompt, params, None, arrival_time=float(i)))
    return requests


class _Timer:
    """The duration of every call, in microseconds, per operation."""

    def __init__(self) -> None:
        self.us = collections.defaultdict(list)

    def add(self, name: str, start: float) -> None:
        self.us[name].append(1e6 * (time.perf_counter() - start))


def _admit(manager: KVCacheManager, request: Request, chunk: int, timer: _Timer) -> int:
    start = time.perf_counter()
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    timer.add("get_computed_blocks", start)
    num_new_computed = num_hit_tokens
    while request.num_computed_tokens + num_new_computed < request.num_tokens:
        num_computed_tokens = request.num_computed_tokens + num_new_computed
        num_new_tokens = min(chunk, request.num_tokens - num_computed_tokens)
        start = time.perf_counter()
        new_blocks = manager.allocate_slots(request, num_new_tokens, num_new_computed, hits)
        timer.add("allocate_slots (prefill)", start)
        if new_blocks is None:
            raise RuntimeError("the pool is too small for --max-running requests")
        request.num_computed_tokens += num_new_computed + num_new_tokens
        num_new_computed, hits = 0, None
    return num_hit_tokens


def _decode_step(manager: KVCacheManager, running: list[Request], timer: _Timer) -> list[Request]:
    """One decode token for every running request; returns those that finished."""
    finished = []
    for request in running:
        request.append_output_token_ids(request.num_tokens % 50_000)
        start = time.perf_counter()
        new_blocks = manager.allocate_slots(request, 1)
        timer.add("allocate_slots (decode)", start)
        if new_blocks is None:
            raise RuntimeError("the pool is too small for --max-running requests")
        request.num_computed_tokens += 1
        if request.num_output_tokens == request.max_tokens:
            finished.append(request)
    return finished


def _run_once(args: argparse.Namespace, hash_algo: str) -> tuple[_Timer, int]:
    blocks_per_request = -(-(args.prompt_len + args.output_len) // args.block_size)
    manager = KVCacheManager(
        args.block_size,
        num_gpu_blocks=args.max_running * blocks_per_request * 5 // 4 + 1,
        max_model_len=args.prompt_len + args.output_len,
        hash_algo=hash_algo,
    )
    timer, num_hit_tokens = _Timer(), 0
    waiting = collections.deque(_make_requests(args))
    running: list[Request] = []
    while waiting or running:
        while waiting and len(running) < args.max_running:
            request = waiting.popleft()
            num_hit_tokens += _admit(manager, request, args.prefill_chunk, timer)
            running.append(request)
        for request in _decode_step(manager, running, timer):
            start = time.perf_counter()
            manager.free(request)
            timer.add("free", start)
            running.remove(request)
    return timer, num_hit_tokens


def _summarize(timers: list[_Timer], num_hit_tokens: int, num_prompt_tokens: int) -> dict:
    best_mean_us = {name: min(statistics.fmean(timer.us[name]) for timer in timers) for name in _CALLS}
    median_us = {name: statistics.median(us for timer in timers for us in timer.us[name]) for name in _CALLS}
    allocate = ("allocate_slots (prefill)", "allocate_slots (decode)")
    allocate_us = [us for timer in timers for name in allocate for us in timer.us[name]]
    return {
        "mean_us": best_mean_us,
        "median_us": median_us,
        "calls_per_run": {name: len(timers[0].us[name]) for name in _CALLS},
        "allocate_slots_mean_us": statistics.fmean(allocate_us),
        "allocate_slots_median_us": statistics.median(allocate_us),
        "prefix_hit_rate": num_hit_tokens / num_prompt_tokens,
    }


def run(args: argparse.Namespace) -> dict:
    results = {}
    for hash_algo in args.hash_algos:
        runs = [_run_once(args, hash_algo) for _ in range(args.repeats)]
        num_prompt_tokens = args.num_requests * args.prompt_len
        results[hash_algo] = _summarize([t for t, _ in runs], runs[0][1], num_prompt_tokens)
    return {
        "date": datetime.date.today().isoformat(),
        "host": harness.host_description(),
        "python": platform.python_version(),
        "command": " ".join(["python -m benchmarks.kv_cache_manager"] + sys.argv[1:]),
        "config": {k: v for k, v in vars(args).items() if k != "output_json"},
        "results": results,
    }


def _print_table(result: dict) -> None:
    """One row per hash function; each cell is "median / mean" microseconds per call."""
    names = list(_CALLS) + ["allocate_slots (all calls)"]
    rows = []
    for hash_algo, r in result["results"].items():
        cells = [f"{r['median_us'][name]:.1f} / {r['mean_us'][name]:.1f}" for name in _CALLS]
        cells.append(f"{r['allocate_slots_median_us']:.1f} / {r['allocate_slots_mean_us']:.1f}")
        cells.append(f"{r['prefix_hit_rate']:.1%}")
        rows.append([hash_algo, *cells])
    harness.print_table(["hash", *(f"{name} us" for name in names), "prefix hit rate"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--shared-fraction", type=float, default=0.5)
    parser.add_argument("--num-prefixes", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--prefill-chunk", type=int, default=2048)
    parser.add_argument("--max-running", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--hash-algos", nargs="+", default=["sha256", "blake2b"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    result = run(args)
    _print_table(result)
    harness.write_json(args.output_json, result)


if __name__ == "__main__":
    main()
