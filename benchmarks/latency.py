r"""Latency: vLLM's latency benchmark. A batch of `--batch-size` random prompts of `--input-len`
tokens, each generating exactly `--output-len` tokens (ignore_eos, `--temperature` 1 by default,
top_p 1); the whole batch is timed, `--num-iters-warmup` untimed runs first, then `--num-iters`.

    python -m benchmarks.latency [--input-len 32 --output-len 128 --batch-size 8] \
        [--num-iters-warmup 10 --num-iters 30] [--output-json latency.json] [engine args...]

CPU (default engine args: the embedded SmolLM2-135M-Instruct, float32; keep it small):

    python -m benchmarks.latency --batch-size 1 --output-len 16 --num-iters-warmup 1 --num-iters 3

H200 (Llama-3.1-8B shapes, random weights; `.carry/smollm2` holds a tokenizer):

    PYTHONPATH=. python3 -m benchmarks.latency --model benchmarks/configs/llama-3.1-8b \
        --tokenizer .carry/smollm2 --load-format dummy --dtype bfloat16 --max-model-len 2048 \
        --batch-size 8 1 --output-json latency.json

Several batch sizes and temperatures (`--temperature 0 1`: greedy and sampled) share one engine
(one start-up); each pair gets a row, printed when done.
Every iteration draws fresh prompts from the seeded generator, so the prefix cache never
serves a prompt. Besides the whole-batch latency (mean, p10/p25/p50/p75/p90/p99) each row
times the batch with `max_tokens=1` (`prefill_s`: prefill plus one sampled token) and
derives the mean decode step, (latency - prefill) / (output_len - 1); the roofline columns
compare them with `benchmarks.roofline` (decode: HBM bandwidth, prefill: tensor cores).
"""

import argparse
import sys
import time

import numpy as np

from benchmarks import harness, roofline
from vjx import EngineArgs, SamplingParams

PERCENTILES = (10, 25, 50, 75, 90, 99)
HEADER = [
    "batch",
    "in",
    "out",
    "mean s",
    "p50 s",
    "p90 s",
    "p99 s",
    "prefill s",
    "decode step ms",
    "roofline",
    "decode HBM",
    "prefill TC",
    "temp",
]


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")


def time_batches(generate, make_prompts, num_warmup: int, num_iters: int) -> list[float]:
    """Seconds of each timed `generate(prompts)` call, after `num_warmup` untimed ones."""
    for _ in range(num_warmup):
        generate(make_prompts())
    times = []
    for _ in range(num_iters):
        prompts = make_prompts()
        start = time.perf_counter()
        generate(prompts)
        times.append(time.perf_counter() - start)
    return times


def summarize(latencies: list[float]) -> dict:
    """Mean and percentiles (vLLM's set) of whole-batch latencies, in seconds."""
    values = np.asarray(latencies)
    summary = {"latency_s": float(values.mean())}
    for p in PERCENTILES:
        summary[f"p{p}_s"] = float(np.percentile(values, p))
    summary["latencies_s"] = [float(v) for v in values]
    return summary


def measure_batch(generate, make_prompts, args: argparse.Namespace) -> dict:
    """Whole-batch latency, prefill latency and the mean decode step of one batch size.

    `generate(prompts, max_tokens)` runs a batch to completion; `make_prompts()` draws one.
    """
    row = summarize(
        time_batches(lambda p: generate(p, args.output_len), make_prompts, args.num_iters_warmup, args.num_iters)
    )
    prefill = time_batches(lambda p: generate(p, 1), make_prompts, min(args.num_iters_warmup, 1), args.num_iters)
    row["prefill_s"] = float(np.mean(prefill))
    row["decode_step_s"] = None
    if args.output_len > 1:
        row["decode_step_s"] = (row["latency_s"] - row["prefill_s"]) / (args.output_len - 1)
    return row


def run_batch(llm, args: argparse.Namespace, batch: tuple[int, float], rng: np.random.Generator) -> dict:
    """One row: `measure_batch` on the engine with `batch` = (batch size, temperature), fresh
    random prompts per run."""
    batch_size, temperature = batch
    vocab_size = harness.prompt_vocab_size(llm)

    def make_prompts():
        ids = harness.random_token_ids(rng, vocab_size, [args.input_len] * batch_size)
        return [{"prompt_token_ids": row} for row in ids]

    def generate(prompts, max_tokens: int):
        params = SamplingParams(
            temperature=temperature,
            top_p=1.0,
            ignore_eos=True,
            max_tokens=max_tokens,
            detokenize=not args.disable_detokenize,
        )
        return llm.generate(prompts, params, use_tqdm=False)

    row = {"batch_size": batch_size, "input_len": args.input_len, "output_len": args.output_len}
    row["temperature"] = temperature
    row.update(measure_batch(generate, make_prompts, args))
    return row


def table_row(run: dict) -> list[str]:
    fmt = harness.fmt
    decode_ms = None if run["decode_step_s"] is None else run["decode_step_s"] * 1e3
    return [
        str(run["batch_size"]),
        str(run["input_len"]),
        str(run["output_len"]),
        fmt(run["latency_s"]),
        fmt(run["p50_s"]),
        fmt(run["p90_s"]),
        fmt(run["p99_s"]),
        fmt(run["prefill_s"]),
        fmt(decode_ms, ".2f"),
        fmt(run["latency_roofline_fraction"], ".1%"),
        fmt(run["decode_hbm_fraction"], ".1%"),
        fmt(run["prefill_tensor_core_fraction"], ".1%"),
        fmt(run["temperature"], "g"),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--batch-size", type=int, nargs="+", default=[8], help="One or more batch sizes, run in order on one engine."
    )
    parser.add_argument(
        "--temperature", type=float, nargs="+", default=[1.0], help="One or more temperatures (0: greedy)."
    )
    parser.add_argument("--num-iters-warmup", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=30)
    parser.add_argument("--disable-detokenize", action="store_true")
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    _positive("input_len", args.input_len)
    _positive("output_len", args.output_len)
    _positive("num_iters", args.num_iters)
    _positive("num_iters_warmup", args.num_iters_warmup, minimum=0)
    for batch_size in args.batch_size:
        _positive("batch_size", batch_size)
    for temperature in args.temperature:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    llm, result = harness.start_engine_run(args, "latency")
    model_config = llm.llm_engine.config.model_config
    device = result["device"]
    result.update(
        {
            "dtype": model_config.dtype,
            "num_iters_warmup": args.num_iters_warmup,
            "num_iters": args.num_iters,
            "runs": [],
        }
    )
    shape = roofline.ModelShape.from_hf_config(model_config.hf_config.to_dict(), model_config.dtype)
    peak = roofline.DEVICE_PEAKS.get(device)
    rng = np.random.default_rng(args.seed)
    print(
        f"latency: {device}, {model_config.model}, start-up "
        + ", ".join(f"{name} {value}" for name, value in harness.startup_rows(result)),
        flush=True,
    )
    harness.print_header(HEADER)
    engine = llm.llm_engine
    profiler = engine.engine_core.engine_core.profiler if engine.config.profile_host else None
    for batch_size, temperature in [(b, t) for t in args.temperature for b in args.batch_size]:
        if profiler is not None:
            profiler.reset()
        run = run_batch(llm, args, (batch_size, temperature), rng)
        if profiler is not None:
            run["host_profile_ms"] = {name: value * 1e3 for name, value in profiler.means().items()}
        run.update(roofline.latency_roofline(shape, peak, (batch_size, args.input_len, args.output_len), run))
        result["runs"].append(run)
        harness.print_row(table_row(run))
        if profiler is not None:
            print("  host ms/step: " + ", ".join(f"{k} {v:.2f}" for k, v in run["host_profile_ms"].items()), flush=True)
        harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
