"""Offline throughput: engine start-up (load, warm-up) and generate throughput.

    python -m benchmarks.throughput --num-prompts 16 --output-len 64 [engine args...]

Prompts are random token ids of `--input-len` tokens (seeded); every request runs exactly
`--output-len` tokens (ignore_eos). Prints one table and writes JSON to `--output-json`.
"""

import argparse
import datetime
import json
import platform
import sys
import time

import jax
import numpy as np

from vjx import LLM, EngineArgs, SamplingParams


def _prompts(llm: LLM, num_prompts: int, input_len: int, seed: int) -> list[dict]:
    vocab_size = min(llm.llm_engine.config.model_config.hf_config.vocab_size, len(llm.get_tokenizer()))
    rng = np.random.default_rng(seed)
    # Ids from the low half of the vocab avoid special tokens at the top.
    ids = rng.integers(0, vocab_size // 2, size=(num_prompts, input_len))
    return [{"prompt_token_ids": row.tolist()} for row in ids]


def run(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    # In-process, so the engine core's load and warm-up times can be read.
    llm = LLM(**{**vars(EngineArgs.from_cli_args(args)), "multiprocess": False})
    engine_ready = time.perf_counter() - start
    core = llm.llm_engine.engine_core.engine_core
    prompts = _prompts(llm, args.num_prompts, args.input_len, args.seed)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_output = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "date": datetime.date.today().isoformat(),
        "device": f"{jax.default_backend()}: {jax.devices()[0].device_kind}",
        "host": platform.processor() or platform.machine(),
        "command": " ".join(["python -m benchmarks.throughput"] + sys.argv[1:]),
        "model": llm.llm_engine.config.model_config.model,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "load_s": core.model_executor.worker.load_time,
        "warmup_s": core.warmup_time,
        "engine_ready_s": engine_ready,
        "generate_s": elapsed,
        "output_tokens": num_output,
        "output_tok_per_s": num_output / elapsed,
        "total_tok_per_s": (num_output + args.num_prompts * args.input_len) / elapsed,
        "requests_per_s": args.num_prompts / elapsed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    result = run(args)
    rows = [("load", f"{result['load_s']:.2f} s"), ("warm-up (compile)", f"{result['warmup_s']:.2f} s"),
            ("generate", f"{result['generate_s']:.2f} s"),
            ("output throughput", f"{result['output_tok_per_s']:.1f} tok/s"),
            ("total throughput", f"{result['total_tok_per_s']:.1f} tok/s"),
            ("requests", f"{result['requests_per_s']:.2f} req/s")]
    print(f"| {result['device']} | {args.num_prompts} x ({args.input_len} in, {args.output_len} out) |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
