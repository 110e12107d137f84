"""Online serving benchmark: a load generator for a running OpenAI-compatible server.

    vjx serve --max-num-seqs 64 &
    python -m benchmarks.serve --request-rate 1 4 inf --num-prompts 64 --input-len 128 --output-len 64

Prompts are seeded random token ids in [100, --vocab-size) (clear of the low special ids),
new ones for each rate so no run hits another's prefix cache;
each request streams `/v1/completions` with exactly `--output-len` tokens (`ignore_eos`,
greedy). Requests arrive as a Poisson process at each `--request-rate` (requests/s; `inf`
sends them all at once), at most `--max-concurrency` at a time. Per rate it reports TTFT
(time to the first streamed token), TPOT (time per output token after the first), ITL
(gaps between streamed events), end-to-end latency, and request and token throughput;
prints one table and writes all rates to `--output-json`. Needs only the `openai` client.
"""

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
import urllib.request

import numpy as np

from benchmarks.harness import fmt, print_table, run_metadata, write_json

_MIN_TOKEN_ID = 100


@dataclasses.dataclass
class RequestResult:
    ok: bool
    latency_s: float = 0.0
    ttft_s: float = 0.0
    itls_s: list[float] = dataclasses.field(default_factory=list)
    num_output_tokens: int = 0
    error: str = ""


async def _send(client, model: str, prompt: list[int], output_len: int) -> RequestResult:
    """One streamed completion, timed from the send to each event that carries text."""
    start = time.perf_counter()
    last, ttft, itls, usage = start, None, [], None
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=output_len,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            if ttft is None:
                ttft = now - start
            else:
                itls.append(now - last)
            last = now
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        return RequestResult(ok=False, error=f"{type(e).__name__}: {e}")
    num_tokens = usage.completion_tokens if usage is not None else len(itls) + 1
    return RequestResult(
        ok=ttft is not None, latency_s=last - start, ttft_s=ttft or 0.0, itls_s=itls, num_output_tokens=num_tokens
    )


async def _run_rate(
    client, model: str, prompts: list[list[int]], args: argparse.Namespace, rate: float
) -> tuple[list[RequestResult], float]:
    """All prompts at `rate` requests/s (Poisson arrivals); returns results and the wall time."""
    rng = np.random.default_rng(args.seed)
    semaphore = asyncio.Semaphore(args.max_concurrency or len(prompts))

    async def limited(prompt: list[int]) -> RequestResult:
        async with semaphore:
            return await _send(client, model, prompt, args.output_len)

    tasks = []
    start = time.perf_counter()
    for prompt in prompts:
        tasks.append(asyncio.create_task(limited(prompt)))
        if math.isfinite(rate):
            await asyncio.sleep(rng.exponential(1.0 / rate))
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


def _stats_ms(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    array = np.asarray(values) * 1000.0
    return {"mean": float(array.mean()), "median": float(np.median(array)), "p99": float(np.percentile(array, 99))}


def summarize(results: list[RequestResult], duration_s: float, rate: float, input_len: int) -> dict:
    """One rate's figures: throughput over the wall time, latencies in milliseconds."""
    done = [r for r in results if r.ok]
    num_output = sum(r.num_output_tokens for r in done)
    tpots = [(r.latency_s - r.ttft_s) / (r.num_output_tokens - 1) for r in done if r.num_output_tokens > 1]
    return {
        "request_rate": "inf" if math.isinf(rate) else rate,
        "duration_s": duration_s,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "request_throughput": len(done) / duration_s,
        "output_throughput": num_output / duration_s,
        "total_token_throughput": (num_output + input_len * len(done)) / duration_s,
        "ttft_ms": _stats_ms([r.ttft_s for r in done]),
        "tpot_ms": _stats_ms(tpots),
        "itl_ms": _stats_ms([itl for r in done for itl in r.itls_s]),
        "e2e_latency_ms": _stats_ms([r.latency_s for r in done]),
    }


def _served_model(base_url: str, api_key: str | None) -> tuple[str, dict]:
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        card = json.loads(response.read())["data"][0]
    return card["id"], card


def _random_prompts(args: argparse.Namespace, num_prompts: int, run_index: int) -> list[list[int]]:
    """Fresh prompts for each rate (seeded by `--seed` and the run), so no run finds another's
    prompts in the prefix cache."""
    rng = np.random.default_rng([args.seed, run_index + 1])
    return rng.integers(_MIN_TOKEN_ID, args.vocab_size, size=(num_prompts, args.input_len)).tolist()


async def run(args: argparse.Namespace) -> dict:
    import openai

    model, card = (args.model, {}) if args.model else _served_model(args.base_url, args.api_key)
    client = openai.AsyncOpenAI(
        base_url=args.base_url.rstrip("/") + "/v1",
        api_key=args.api_key or "unused",
        max_retries=0,
        timeout=args.timeout,
    )
    warmup = await _send(client, model, _random_prompts(args, 1, run_index=-1)[0], 4)
    if not warmup.ok:
        raise RuntimeError(f"The warm-up request failed: {warmup.error}")
    runs = []
    for run_index, rate in enumerate(args.request_rate):
        prompts = _random_prompts(args, args.num_prompts, run_index)
        results, duration = await _run_rate(client, model, prompts, args, rate)
        runs.append(summarize(results, duration, rate, args.input_len))
    await client.close()
    metadata = run_metadata("serve", "vjx", args.platform, args.device, card.get("root") or model)
    return {
        **metadata,
        "base_url": args.base_url,
        "served_model": model,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "max_concurrency": args.max_concurrency,
        "runs": runs,
    }


def print_results(result: dict) -> None:
    header = [
        "rate (req/s)",
        "done",
        "req/s",
        "out tok/s",
        "TTFT mean/med/p99 (ms)",
        "TPOT mean/med/p99 (ms)",
        "ITL mean/med/p99 (ms)",
    ]

    def triple(stats: dict) -> str:
        return " / ".join(fmt(stats[key], ".1f") for key in ("mean", "median", "p99"))

    rows = [
        [
            str(run["request_rate"]),
            f"{run['completed']}/{run['completed'] + run['failed']}",
            fmt(run["request_throughput"], ".2f"),
            fmt(run["output_throughput"], ".1f"),
            triple(run["ttft_ms"]),
            triple(run["tpot_ms"]),
            triple(run["itl_ms"]),
        ]
        for run in result["runs"]
    ]
    print(
        f"{result['device']}: {result['num_prompts']} x ({result['input_len']} in, {result['output_len']} out), "
        f"max concurrency {result['max_concurrency'] or 'unlimited'}"
    )
    print_table(header, rows)


def _make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vjx bench serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="The server's address.")
    parser.add_argument("--model", default=None, help="Model name to send; the server's first when not given.")
    parser.add_argument("--api-key", default=None, help="The server's API key, if it has one.")
    parser.add_argument(
        "--request-rate",
        type=float,
        nargs="+",
        default=[float("inf")],
        help="Requests per second, one run per value; inf sends every request at once.",
    )
    parser.add_argument("--max-concurrency", type=int, default=None, help="Most requests in flight at a time.")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=32000, help="Prompt token ids are drawn below this.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds one request may take.")
    parser.add_argument("--platform", default="unknown", help="Where the server runs, for the record (e.g. cpu).")
    parser.add_argument("--device", default="unknown", help="The server's device, for the record.")
    parser.add_argument("--output-json", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _make_parser().parse_args(argv)
    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            print(f"vjx bench serve: {name} must be at least 1, got {getattr(args, name)}.", file=sys.stderr)
            return 2
    if any(not rate > 0 for rate in args.request_rate):
        print(f"vjx bench serve: request_rate must be > 0 (or inf), got {args.request_rate}.", file=sys.stderr)
        return 2
    result = asyncio.run(run(args))
    print_results(result)
    write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
