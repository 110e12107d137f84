"""Tensor parallelism: the same model at several `tensor_parallel_size`s (TP 1 against TP 2).

For each size, in an engine of its own:
  - greedy tokens of `--num-greedy-prompts` seeded random prompts, with their top-5 logprobs;
  - decode latency at each `--batch-sizes` (whole-batch latency of `--latency-input-len` in /
    `--latency-output-len` out, minus the prefill-only latency, per decode step);
  - throughput of `--num-prompts` requests of `--input-len` in / `--output-len` out
    (ignore_eos, temperature 1, as vLLM's throughput benchmark).
The sizes are then compared: greedy tokens against the first size, exactly and by the tests'
rule (at the first difference, each side's token is in the other's top 5: bfloat16 partial
sums reduced across devices may flip a near tie), and one table is printed.

H200 x 2 (Llama-3.1-8B shapes, random weights; `.carry/smollm2` holds a tokenizer):

    PYTHONPATH=. python3 -m benchmarks.parallel --model benchmarks/configs/llama-3.1-8b \
        --tokenizer .carry/smollm2 --load-format dummy --dtype bfloat16 --max-model-len 1024 \
        --tp-sizes 1 2 --output-json benchmarks/results/tp.json

With several sizes each runs in a fresh child process (an engine takes most of its devices'
memory). A device command is limited to 10 minutes, so sizes can also run one per command
(`--tp-sizes 1 --output-json tp1.json`, then `--tp-sizes 2 ...`) and be compared afterwards
with `--compare tp1.json tp2.json --output-json tp.json`.
"""

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import harness
from vjx import LLM, EngineArgs, SamplingParams

TOP_K = 5


def _prompts(rng: np.random.Generator, vocab_size: int, num_prompts: int, input_len: int) -> list[dict]:
    # Ids from the low half of the vocab avoid special tokens at the top.
    ids = rng.integers(0, vocab_size // 2, size=(num_prompts, input_len))
    return [{"prompt_token_ids": row.tolist()} for row in ids]


def _start(args: argparse.Namespace, tensor_parallel_size: int) -> tuple[LLM, dict]:
    engine_args = {
        **vars(EngineArgs.from_cli_args(args)),
        "multiprocess": False,
        "tensor_parallel_size": tensor_parallel_size,
    }
    start = time.perf_counter()
    llm = LLM(**engine_args)
    core = llm.llm_engine.engine_core.engine_core
    startup = {
        "engine_ready_s": time.perf_counter() - start,
        "load_s": core.model_executor.worker.load_time,
        "warmup_s": core.warmup_time,
        "num_gpu_blocks": core.num_gpu_blocks,
    }
    return llm, startup


def _vocab_size(llm: LLM) -> int:
    return min(llm.llm_engine.config.model_config.hf_config.vocab_size, len(llm.get_tokenizer()))


def _greedy(llm: LLM, args: argparse.Namespace) -> list[dict]:
    """Each greedy prompt's tokens and, per position, the top-5 token ids."""
    prompts = _prompts(
        np.random.default_rng(args.seed), _vocab_size(llm), args.num_greedy_prompts, args.greedy_input_len
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.greedy_output_len, ignore_eos=True, logprobs=TOP_K)
    rows = []
    for output in llm.generate(prompts, params, use_tqdm=False):
        completion = output.outputs[0]
        top = [sorted(t for t, lp in position.items() if lp.rank <= TOP_K) for position in completion.logprobs]
        rows.append({"token_ids": list(completion.token_ids), "top_ids": top})
    return rows


def _time_generate(llm: LLM, prompts: list[dict], params: SamplingParams) -> float:
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def _decode_latency(llm: LLM, args: argparse.Namespace, batch_size: int) -> dict:
    """Mean whole-batch latency and prefill latency (max_tokens=1), fresh prompts each run."""
    rng = np.random.default_rng(args.seed + batch_size)
    vocab_size = _vocab_size(llm)
    full = SamplingParams(temperature=1.0, max_tokens=args.latency_output_len, ignore_eos=True)
    prefill = SamplingParams(temperature=1.0, max_tokens=1, ignore_eos=True)
    times = {"latency": [], "prefill": []}
    for i in range(args.num_iters_warmup + args.num_iters):
        for name, params in (("latency", full), ("prefill", prefill)):
            elapsed = _time_generate(llm, _prompts(rng, vocab_size, batch_size, args.latency_input_len), params)
            if i >= args.num_iters_warmup:
                times[name].append(elapsed)
    latency, prefill_s = float(np.mean(times["latency"])), float(np.mean(times["prefill"]))
    return {
        "batch_size": batch_size,
        "latency_s": latency,
        "p50_latency_s": float(np.median(times["latency"])),
        "prefill_s": prefill_s,
        "decode_step_ms": 1e3 * (latency - prefill_s) / max(args.latency_output_len - 1, 1),
    }


def _throughput(llm: LLM, args: argparse.Namespace) -> dict:
    prompts = _prompts(np.random.default_rng(args.seed + 1), _vocab_size(llm), args.num_prompts, args.input_len)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_output = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "generate_s": elapsed,
        "output_tok_per_s": num_output / elapsed,
        "total_tok_per_s": (num_output + args.num_prompts * args.input_len) / elapsed,
        "requests_per_s": args.num_prompts / elapsed,
    }


def run_size(args: argparse.Namespace, tensor_parallel_size: int) -> dict:
    """Every measurement of one tensor-parallel size, in this process."""
    import jax

    llm, startup = _start(args, tensor_parallel_size)
    llm.generate(
        _prompts(np.random.default_rng(0), _vocab_size(llm), 1, 8),
        SamplingParams(max_tokens=2, ignore_eos=True),
        use_tqdm=False,
    )
    result = {
        "tensor_parallel_size": tensor_parallel_size,
        "device": f"{jax.default_backend()}: {jax.devices()[0].device_kind} x {tensor_parallel_size}",
        **startup,
        "greedy": _greedy(llm, args),
        "latency": [_decode_latency(llm, args, b) for b in args.batch_sizes],
    }
    if args.num_prompts:
        result["throughput"] = _throughput(llm, args)
    llm.shutdown()
    return result


def _run_in_child(argv: list[str], tensor_parallel_size: int) -> dict:
    """One size in a fresh interpreter, so the previous engine's device memory is free."""
    with tempfile.NamedTemporaryFile(suffix=".json") as part:
        command = [
            sys.executable,
            "-m",
            "benchmarks.parallel",
            *_without_option(argv, "--tp-sizes"),
            "--tp-sizes",
            str(tensor_parallel_size),
            "--output-json",
            part.name,
        ]
        subprocess.run(command, check=True)
        with open(part.name) as f:
            return json.load(f)["runs"][0]


def _without_option(argv: list[str], *names: str) -> list[str]:
    """`argv` without the options `names` and their values (also `--output-json`)."""
    names = (*names, "--output-json")
    kept, skipping = [], False
    for token in argv:
        if token.startswith("--"):
            skipping = token.split("=")[0] in names
        if not skipping:
            kept.append(token)
    return kept


def compare_greedy(reference: list[dict], other: list[dict]) -> dict:
    """Exact matches, and whether every first difference passes the top-5 rule."""
    num_exact, first_differences, is_close = 0, [], True
    for i, (ref, got) in enumerate(zip(reference, other, strict=True)):
        diff = next((j for j, (a, b) in enumerate(zip(ref["token_ids"], got["token_ids"])) if a != b), None)
        if diff is None and len(ref["token_ids"]) == len(got["token_ids"]):
            num_exact += 1
            continue
        diff = min(len(ref["token_ids"]), len(got["token_ids"])) if diff is None else diff
        first_differences.append({"prompt": i, "position": diff})
        if diff < min(len(ref["top_ids"]), len(got["top_ids"])):
            is_close &= (
                got["token_ids"][diff] in ref["top_ids"][diff] and ref["token_ids"][diff] in got["top_ids"][diff]
            )
        else:
            is_close = False
    return {
        "num_prompts": len(reference),
        "num_exact": num_exact,
        "first_differences": first_differences,
        "within_top5_rule": is_close,
    }


def summarize(runs: list[dict], argv: list[str]) -> dict:
    reference = runs[0]
    for run in runs[1:]:
        run["greedy_vs_first"] = compare_greedy(reference["greedy"], run["greedy"])
    return {
        "benchmark": "parallel",
        "date": datetime.date.today().isoformat(),
        "host": platform.processor() or platform.machine(),
        "command": " ".join(["python -m benchmarks.parallel", *argv]),
        "runs": runs,
    }


def print_table(result: dict) -> None:
    runs = result["runs"]
    columns = [f"TP {run['tensor_parallel_size']}" for run in runs]
    rows = [
        ("device", [run["device"] for run in runs]),
        ("engine ready s", [f"{run['engine_ready_s']:.1f}" for run in runs]),
        ("KV blocks", [str(run["num_gpu_blocks"]) for run in runs]),
    ]
    for i, row in enumerate(runs[0]["latency"]):
        batch = row["batch_size"]
        rows.append((f"decode step ms, batch {batch}", [f"{run['latency'][i]['decode_step_ms']:.2f}" for run in runs]))
        rows.append((f"batch latency s, batch {batch}", [f"{run['latency'][i]['latency_s']:.3f}" for run in runs]))
    if "throughput" in runs[0]:
        t = runs[0]["throughput"]
        name = f"{t['num_prompts']} x ({t['input_len']} in, {t['output_len']} out)"
        rows.append((f"output tok/s, {name}", [f"{run['throughput']['output_tok_per_s']:.0f}" for run in runs]))
        rows.append(("total tok/s", [f"{run['throughput']['total_tok_per_s']:.0f}" for run in runs]))
    rows.append(("greedy = first size", ["reference"] + [_greedy_cell(run) for run in runs[1:]]))
    harness.print_table(["", *columns], [[name, *cells] for name, cells in rows])


def _greedy_cell(run: dict) -> str:
    c = run["greedy_vs_first"]
    rule = "top-5 rule holds" if c["within_top5_rule"] else "top-5 rule FAILS"
    return f"{c['num_exact']}/{c['num_prompts']} exact, {rule}"


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--compare", nargs="+", default=None, help="Result files of single sizes to combine.")
    parser.add_argument("--num-greedy-prompts", type=int, default=8)
    parser.add_argument("--greedy-input-len", type=int, default=128)
    parser.add_argument("--greedy-output-len", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--latency-input-len", type=int, default=128)
    parser.add_argument("--latency-output-len", type=int, default=128)
    parser.add_argument("--num-iters-warmup", type=int, default=1)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=1000, help="Throughput requests; 0 skips it.")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.compare:
        runs = [run for path in args.compare for run in _load(path)["runs"]]
    elif len(args.tp_sizes) == 1:
        runs = [run_size(args, args.tp_sizes[0])]
    else:
        runs = [_run_in_child(argv, size) for size in args.tp_sizes]
    result = summarize(runs, argv)
    print_table(result)
    harness.write_json(args.output_json, result)
    return result


if __name__ == "__main__":
    main()
