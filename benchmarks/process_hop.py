"""Added per-request latency of running EngineCore in its own process.

    python -m benchmarks.process_hop --num-requests 200 [--output-json PATH]

Times `add_request` -> first token of a 1-token prompt (max_tokens=1), one request at a
time, with EngineCore in this process (`InprocClient`), in a child process (`SyncMPClient`,
what `LLM(multiprocess=True)` uses) and through `AsyncLLM.generate`. The engines run side by
side and the requests alternate between them, so machine noise hits all alike; the model
step is the same in each, so the difference of the medians is the process hop.
"""

import argparse
import asyncio
import datetime
import platform
import statistics
import sys
import time

import jax

from benchmarks import harness
from vjx import AsyncLLM, EngineArgs, SamplingParams
from vjx.engine.llm_engine import LLMEngine

_ENGINE_ARGS = dict(
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=256,
    enable_chunked_prefill=False,
    num_gpu_blocks_override=400,
    async_scheduling=False,
    disable_log_stats=True,
)
_PROMPT = {"prompt_token_ids": [1000]}
_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


def _sync_first_token_s(engine: LLMEngine, request_id: str) -> float:
    start = time.perf_counter()
    engine.add_request(request_id, _PROMPT, _PARAMS)
    while not any(o.outputs[0].token_ids for o in engine.step()):
        pass
    return time.perf_counter() - start


async def _async_first_token_s(engine: AsyncLLM, request_id: str) -> float:
    start = time.perf_counter()
    async for output in engine.generate(_PROMPT, _PARAMS, request_id):
        if output.outputs[0].token_ids:
            elapsed = time.perf_counter() - start
    return elapsed


def _summary(times_s: list[float]) -> dict:
    ms = sorted(t * 1000 for t in times_s)
    return {"median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))], "min_ms": ms[0]}


def run(num_requests: int, num_warmup: int) -> dict:
    in_process = LLMEngine(EngineArgs(**_ENGINE_ARGS, multiprocess=False))
    multiprocess = LLMEngine(EngineArgs(**_ENGINE_ARGS, multiprocess=True))
    async_llm = AsyncLLM(EngineArgs(**_ENGINE_ARGS))
    loop = asyncio.new_event_loop()
    times: dict[str, list[float]] = {"in_process": [], "multiprocess": [], "async_llm": []}
    try:
        for i in range(num_warmup + num_requests):
            sample = {
                "in_process": _sync_first_token_s(in_process, f"inproc-{i}"),
                "multiprocess": _sync_first_token_s(multiprocess, f"mp-{i}"),
                "async_llm": loop.run_until_complete(_async_first_token_s(async_llm, f"async-{i}")),
            }
            if i >= num_warmup:
                for name, value in sample.items():
                    times[name].append(value)
    finally:
        multiprocess.shutdown()
        async_llm.shutdown()
        # Let the cancelled output tasks finish before the loop goes.
        loop.run_until_complete(asyncio.sleep(0.1))
        loop.close()
    summaries = {name: _summary(values) for name, values in times.items()}
    base = summaries["in_process"]["median_ms"]
    return {
        "date": datetime.date.today().isoformat(),
        "device": f"{jax.default_backend()}: {jax.devices()[0].device_kind}",
        "host": platform.processor() or platform.machine(),
        "command": " ".join(["python -m benchmarks.process_hop"] + sys.argv[1:]),
        "num_requests": num_requests,
        **summaries,
        "added_median_ms": {
            "multiprocess": summaries["multiprocess"]["median_ms"] - base,
            "async_llm": summaries["async_llm"]["median_ms"] - base,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--num-warmup", type=int, default=10)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    result = run(args.num_requests, args.num_warmup)
    rows = []
    for name in ("in_process", "multiprocess", "async_llm"):
        row = result[name]
        added = result["added_median_ms"].get(name, 0.0)
        rows.append([name, f"{row['median_ms']:.3f}", f"{row['p90_ms']:.3f}", f"{row['min_ms']:.3f}", f"{added:+.3f}"])
    harness.print_table([result["device"], "median ms", "p90 ms", "min ms", "added median ms"], rows)
    harness.write_json(args.output_json, result)


if __name__ == "__main__":
    main()
