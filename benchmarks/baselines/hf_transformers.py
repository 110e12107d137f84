r"""Hugging Face transformers baseline: the latency and throughput workloads of
`benchmarks.latency` and `benchmarks.throughput`, run by `model.generate` in PyTorch on the
same device, so every result table gets a side-by-side row.

    python -m benchmarks.baselines.hf_transformers latency [--batch-size 8 ...] [--input-len 32 \
        --output-len 128 --num-iters-warmup 10 --num-iters 30] [common flags]
    python -m benchmarks.baselines.hf_transformers throughput [--num-prompts 64 --input-len 512 \
        --output-len 512 --batch-size 64] [common flags]

Common flags: `--model DIR` (a config.json; weights are random from the config through
`AutoModelForCausalLM.from_config`, seeded, never loaded), `--dtype`, `--device` (cuda when
available, else cpu), `--cache-implementation` (transformers' KV cache: `dynamic` grows it
per step; `static` preallocates it, which lets transformers compile the decode step with
torch.compile; `auto`, the default, is static on CUDA, where it cut the H200's 32/128/8
latency from 3.8 s to 1.0 s after about a minute of compiling, and dynamic on CPU),
`--seed`, `--output-json`.

The workloads match vjx's: random prompt ids; every request generates exactly its output
length (`min_new_tokens = max_new_tokens`); latency samples (temperature 1, top_p 1, no
top_k) and times the whole batch plus a `max_new_tokens=1` prefill; throughput is greedy and
runs the prompts in static batches of `--batch-size` (generate has no continuous batching),
fixed lengths only. JSON fields are those of the vjx benchmarks, with engine
"hf-transformers". CPU, a tiny config:

    python -m benchmarks.baselines.hf_transformers latency --model DIR --dtype float32 \
        --batch-size 2 --input-len 8 --output-len 8 --num-iters-warmup 1 --num-iters 2

H200 (Llama-3.1-8B shapes):

    PYTHONPATH=. python3 -m benchmarks.baselines.hf_transformers latency \
        --model benchmarks/configs/llama-3.1-8b --batch-size 8 1 --output-json hf_latency.json
"""

import argparse
import functools
import sys
import time

import numpy as np

from benchmarks import harness, latency, roofline, throughput

ENGINE_NAME = "hf-transformers"


class HFRunner:
    """A random-weight model on one torch device and the `generate` calls the workloads time."""

    def __init__(self, args: argparse.Namespace):
        import torch
        import transformers

        self.torch = torch
        self.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.config = transformers.AutoConfig.from_pretrained(args.model)
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        with self.device:
            self.model = transformers.AutoModelForCausalLM.from_config(self.config, dtype=getattr(torch, args.dtype))
        self.model.eval()
        self.load_s = time.perf_counter() - start
        self.cache_implementation = args.cache_implementation
        if self.cache_implementation == "auto":
            self.cache_implementation = "static" if self.device.type == "cuda" else "dynamic"
        self.vocab_size = self.config.vocab_size // 2

    @property
    def device_name(self) -> tuple[str, str]:
        if self.device.type == "cuda":
            return "gpu", self.torch.cuda.get_device_name(self.device)
        return self.device.type, self.device.type

    def generate(self, prompt_ids: list[list[int]], max_new_tokens: int, do_sample: bool) -> int:
        """Generates exactly `max_new_tokens` per prompt (equal lengths); returns the count."""
        input_ids = self.torch.tensor(prompt_ids, device=self.device)
        kwargs = {"temperature": 1.0, "top_p": 1.0, "top_k": 0} if do_sample else {}
        if self.cache_implementation != "dynamic":
            kwargs["cache_implementation"] = self.cache_implementation
        with self.torch.inference_mode():
            out = self.model.generate(
                input_ids,
                attention_mask=self.torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=do_sample,
                pad_token_id=0,
                **kwargs,
            )
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return (out.shape[1] - input_ids.shape[1]) * out.shape[0]


def _result(runner: HFRunner, benchmark: str, args: argparse.Namespace) -> tuple[dict, roofline.ModelShape]:
    platform_name, device = runner.device_name
    result = harness.run_metadata(benchmark, ENGINE_NAME, platform_name, device, args.model)
    result.update(
        {
            "load_s": runner.load_s,
            "warmup_s": None,
            "dtype": args.dtype,
            "cache_implementation": runner.cache_implementation,
        }
    )
    return result, roofline.ModelShape.from_hf_config(runner.config.to_dict(), args.dtype)


def run_latency(args: argparse.Namespace) -> dict:
    runner = HFRunner(args)
    result, shape = _result(runner, "latency", args)
    result.update({"num_iters_warmup": args.num_iters_warmup, "num_iters": args.num_iters, "runs": []})
    peak = roofline.DEVICE_PEAKS.get(result["device"])
    rng = np.random.default_rng(args.seed)
    print(f"latency: {ENGINE_NAME}, {result['device']}, {args.model}, random init {runner.load_s:.2f} s", flush=True)
    harness.print_header(latency.HEADER)
    for batch_size in args.batch_size:
        make_prompts = functools.partial(
            harness.random_token_ids, rng, runner.vocab_size, [args.input_len] * batch_size
        )
        run = {"batch_size": batch_size, "input_len": args.input_len, "output_len": args.output_len}
        run["temperature"] = 1.0  # it samples as vjx's latency does by default
        run.update(latency.measure_batch(lambda p, n: runner.generate(p, n, do_sample=True), make_prompts, args))
        run.update(roofline.latency_roofline(shape, peak, (batch_size, args.input_len, args.output_len), run))
        result["runs"].append(run)
        harness.print_row(latency.table_row(run))
        harness.write_json(args.output_json, result)
    return result


def run_throughput(args: argparse.Namespace) -> dict:
    runner = HFRunner(args)
    result, shape = _result(runner, "throughput", args)
    rng = np.random.default_rng(args.seed)
    runner.generate(harness.random_token_ids(rng, runner.vocab_size, [args.input_len]), 2, do_sample=False)
    num_input = args.num_prompts * args.input_len
    runs = []
    for _ in range(args.num_iters):
        prompts = harness.random_token_ids(rng, runner.vocab_size, [args.input_len] * args.num_prompts)
        num_output = 0
        start = time.perf_counter()
        for first in range(0, args.num_prompts, args.batch_size):
            num_output += runner.generate(prompts[first : first + args.batch_size], args.output_len, do_sample=False)
        elapsed = time.perf_counter() - start
        runs.append(throughput.run_rates(elapsed, args.num_prompts, num_input, num_output))
    summary = throughput.summarize_runs(runs)
    elapsed = summary["generate_s"]
    result.update(
        {
            "dataset": "random",
            "num_prompts": args.num_prompts,
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "mean_input_len": args.input_len,
            "mean_output_len": summary["output_tokens"] / args.num_prompts,
            "input_tokens": num_input,
            **summary,
        }
    )
    lengths = [(args.input_len, args.output_len)] * args.num_prompts
    result.update(roofline.throughput_roofline(shape, roofline.DEVICE_PEAKS.get(result["device"]), lengths, elapsed))
    print(
        f"throughput: {ENGINE_NAME}, random init {runner.load_s:.2f} s, generate {elapsed:.2f} s "
        f"in batches of {args.batch_size}",
        flush=True,
    )
    harness.print_table(throughput.HEADER, [throughput.table_row(result)])
    harness.write_json(args.output_json, result)
    return result


def _common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="benchmarks/configs/llama-3.1-8b", help="Directory with a config.json.")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--device", default=None, help="A torch device; cuda when available, else cpu.")
    parser.add_argument(
        "--cache-implementation",
        default="auto",
        choices=("auto", "dynamic", "static"),
        help="auto: static on CUDA, dynamic on CPU.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    lat = sub.add_parser("latency", help="benchmarks.latency's workload")
    lat.add_argument("--input-len", type=int, default=32)
    lat.add_argument("--output-len", type=int, default=128)
    lat.add_argument("--batch-size", type=int, nargs="+", default=[8])
    lat.add_argument("--num-iters-warmup", type=int, default=10)
    lat.add_argument("--num-iters", type=int, default=30)
    tput = sub.add_parser("throughput", help="benchmarks.throughput's workload (fixed lengths)")
    tput.add_argument("--num-prompts", type=int, default=64)
    tput.add_argument("--input-len", type=int, default=512)
    tput.add_argument("--output-len", type=int, default=512)
    tput.add_argument("--batch-size", type=int, default=64, help="Prompts per generate call.")
    tput.add_argument("--num-iters", type=int, default=1, help="Timed runs; the median run is reported.")
    for p in (lat, tput):
        _common_flags(p)
    args = parser.parse_args(argv)
    checks = [("input_len", args.input_len), ("output_len", args.output_len)]
    if args.benchmark == "latency":
        checks += [("batch_size", size) for size in args.batch_size]
    else:
        checks += [("batch_size", args.batch_size), ("num_prompts", args.num_prompts), ("num_iters", args.num_iters)]
    for name, value in checks:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    (run_latency if args.benchmark == "latency" else run_throughput)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
