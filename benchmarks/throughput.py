r"""Offline throughput: engine start-up (load, warm-up) and the throughput of `--num-prompts`
requests submitted at once.

    python -m benchmarks.throughput [--num-prompts 16 --input-len 32 --output-len 64] \
        [--dataset random|sharegpt-synthetic] [--output-json throughput.json] [engine args...]

Prompts are seeded random token ids (`--seed`); every request runs exactly its output length
(ignore_eos). Two length distributions (`--dataset`):

- `random` (default): every request has `--input-len` prompt tokens and `--output-len` output
  tokens.
- `sharegpt-synthetic`: a seeded stand-in for vLLM's ShareGPT benchmark, without the data set.
  Input and output lengths are drawn independently from log-normal distributions whose means
  match ShareGPT's published per-request means under a Llama tokenizer (about 220 prompt and
  200 output tokens), with sigma 1.0 (a median of mean * e^-0.5: about 133 and 121 tokens,
  and a long tail). Input lengths are clipped to [4, min(1024, max_model_len - 4)] and output
  lengths to [4, max_model_len - input], the bounds of vLLM's ShareGPT filter, so the means
  actually run come out a little lower; the JSON records them. `--input-len` and
  `--output-len` are ignored.

Reports requests/s, output tokens/s and total (prompt + output) tokens/s, plus the model
FLOPs of the workload and the fraction of the device's tensor-core peak they reach
(`benchmarks.roofline`). CPU (default engine args: SmolLM2-135M-Instruct, float32):

    python -m benchmarks.throughput --num-prompts 16 --input-len 32 --output-len 64

H200 (Llama-3.1-8B shapes, random weights; `.carry/smollm2` holds a tokenizer):

    PYTHONPATH=. python3 -m benchmarks.throughput --model benchmarks/configs/llama-3.1-8b \
        --tokenizer .carry/smollm2 --load-format dummy --dtype bfloat16 --max-model-len 2048 \
        --num-prompts 1000 --input-len 512 --output-len 512 --output-json throughput.json
"""

import argparse
import sys
import time

import numpy as np

from benchmarks import harness, roofline
from vjx import EngineArgs, SamplingParams

DATASETS = ("random", "sharegpt-synthetic")
SHAREGPT_MEAN_INPUT_LEN = 220
SHAREGPT_MEAN_OUTPUT_LEN = 200
SHAREGPT_SIGMA = 1.0
# vLLM's ShareGPT filter: prompts of at most 1024 tokens, at least 4 tokens each side.
SHAREGPT_MAX_INPUT_LEN = 1024
MIN_LEN = 4


def _log_normal(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    mu = np.log(mean) - SHAREGPT_SIGMA**2 / 2
    return np.rint(rng.lognormal(mu, SHAREGPT_SIGMA, size=size)).astype(np.int64)


def sharegpt_synthetic_lengths(num_prompts: int, seed: int, max_model_len: int) -> list[tuple[int, int]]:
    """(input_len, output_len) per request, seeded; see the module docstring."""
    if max_model_len < 2 * MIN_LEN:
        raise ValueError(f"max_model_len must be >= {2 * MIN_LEN} for sharegpt-synthetic, got {max_model_len}.")
    rng = np.random.default_rng(seed)
    inputs = np.clip(
        _log_normal(rng, SHAREGPT_MEAN_INPUT_LEN, num_prompts),
        MIN_LEN,
        min(SHAREGPT_MAX_INPUT_LEN, max_model_len - MIN_LEN),
    )
    outputs = np.clip(_log_normal(rng, SHAREGPT_MEAN_OUTPUT_LEN, num_prompts), MIN_LEN, max_model_len - inputs)
    return [(int(i), int(o)) for i, o in zip(inputs, outputs)]


def request_lengths(args: argparse.Namespace, max_model_len: int) -> list[tuple[int, int]]:
    if args.dataset == "sharegpt-synthetic":
        return sharegpt_synthetic_lengths(args.num_prompts, args.seed, max_model_len)
    if args.input_len + args.output_len > max_model_len:
        raise ValueError(
            f"input_len + output_len must be <= max_model_len ({max_model_len}), "
            f"got {args.input_len} + {args.output_len}."
        )
    return [(args.input_len, args.output_len)] * args.num_prompts


def time_generate(llm, prompts: list[dict], params: list[SamplingParams]) -> tuple[float, int]:
    """Seconds to run every request to completion, and the output tokens they made."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def run_rates(elapsed: float, num_prompts: int, num_input: int, num_output: int) -> dict:
    """One timed run's record."""
    return {
        "generate_s": elapsed,
        "output_tokens": num_output,
        "requests_per_s": num_prompts / elapsed,
        "output_tok_per_s": num_output / elapsed,
        "total_tok_per_s": (num_output + num_input) / elapsed,
    }


def summarize_runs(runs: list[dict]) -> dict:
    """The median run's record (by time; the lower middle of an even count), the range of the
    runs' output tok/s, and every run."""
    median = harness.lower_median(runs, key=lambda r: r["generate_s"])
    rates = [r["output_tok_per_s"] for r in runs]
    return {**median, "output_tok_per_s_min": min(rates), "output_tok_per_s_max": max(rates), "runs": runs}


def run(args: argparse.Namespace) -> dict:
    """`--num-iters` timed runs of the workload, each on fresh random prompt ids (so the prefix
    cache serves none of them); the result's rates are the median run's."""
    llm, result = harness.start_engine_run(args, "throughput")
    model_config = llm.llm_engine.config.model_config
    lengths = request_lengths(args, model_config.max_model_len)
    rng = np.random.default_rng(args.seed)
    vocab_size = harness.prompt_vocab_size(llm)
    params = [SamplingParams(temperature=args.temperature, max_tokens=o, ignore_eos=True) for _, o in lengths]
    warmup = harness.random_token_ids(rng, vocab_size, [lengths[0][0]])
    llm.generate([{"prompt_token_ids": warmup[0]}], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    num_input = sum(i for i, _ in lengths)
    runs = []
    for _ in range(args.num_iters):
        ids = harness.random_token_ids(rng, vocab_size, [i for i, _ in lengths])
        elapsed, num_output = time_generate(llm, [{"prompt_token_ids": row} for row in ids], params)
        runs.append(run_rates(elapsed, args.num_prompts, num_input, num_output))
        print(
            f"throughput: run {len(runs)} of {args.num_iters}: {elapsed:.2f} s, "
            f"{runs[-1]['output_tok_per_s']:.1f} output tok/s",
            flush=True,
        )
    summary = summarize_runs(runs)
    result.update(
        {
            "dtype": model_config.dtype,
            "dataset": args.dataset,
            "num_prompts": args.num_prompts,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "mean_input_len": num_input / len(lengths),
            "mean_output_len": summary["output_tokens"] / len(lengths),
            "input_tokens": num_input,
            **summary,
        }
    )
    shape = roofline.ModelShape.from_hf_config(model_config.hf_config.to_dict(), model_config.dtype)
    result.update(
        roofline.throughput_roofline(shape, roofline.DEVICE_PEAKS.get(result["device"]), lengths, summary["generate_s"])
    )
    return result


HEADER = ["engine", "device", "workload", "req/s", "output tok/s (min-max)", "total tok/s", "TC fraction"]


def table_row(result: dict) -> list[str]:
    return [
        result["engine"],
        result["device"],
        harness.workload_label(result),
        f"{result['requests_per_s']:.2f}",
        harness.with_range(result["output_tok_per_s"], [r["output_tok_per_s"] for r in result.get("runs", [])]),
        f"{result['total_tok_per_s']:.1f}",
        harness.fmt(result["tensor_core_fraction"], ".1%"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dataset", choices=DATASETS, default="random")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--num-iters", type=int, default=1, help="Timed runs; the median run is reported.")
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if args.num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {args.num_prompts}.")
    if args.num_iters < 1:
        raise ValueError(f"num_iters must be >= 1, got {args.num_iters}.")
    result = run(args)
    startup = ", ".join(f"{name} {value}" for name, value in harness.startup_rows(result))
    print(f"throughput: start-up {startup}, generate {result['generate_s']:.2f} s", flush=True)
    harness.print_table(HEADER, [table_row(result)])
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
