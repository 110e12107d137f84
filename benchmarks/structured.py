r"""Structured-output overhead: output tokens/s of the same batch with a JSON-schema
constraint and without, at each batch size.

    python -m benchmarks.structured [--batch-sizes 1 32 --input-len 32 --output-len 64] \
        [--output-json structured.json] [engine args...]

Each batch is `batch_size` requests of random prompt ids submitted at once, every one running
exactly `--output-len` tokens: the free run ignores EOS, and the constrained run's schema (an
array of at least 10,000 digits) never lets its grammar finish, so both sample the same
number of tokens. The constrained run pays for the grammar on the host (llguidance's mask per row
and step, the token advance), the mask's transfer and its application on the device, and
the lost overlap of async scheduling while a constrained step waits for its predecessor's
tokens. Each configuration runs once to warm up (compiles, the grammar cache), then
`--repeats` times; the table gives the median run's rate and the range.
"""

import argparse
import sys
import time

import numpy as np

from benchmarks import harness
from vjx import EngineArgs, SamplingParams
from vjx.sampling_params import StructuredOutputsParams

HEADER = ["batch", "free tok/s (min-max)", "json_schema tok/s (min-max)", "overhead"]
ENDLESS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 10_000}
"""An array that may not close before 10,000 items: the grammar cannot finish within the
output length, so every request runs all of it."""


def _tokens_per_s(llm, prompts: list[list[int]], params: SamplingParams, repeats: int) -> list[float]:
    """Output tokens/s of each of `repeats` timed runs, after one untimed run."""
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    llm.generate(requests, params, use_tqdm=False)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        num_tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
        if num_tokens != len(prompts) * params.max_tokens:
            raise RuntimeError(f"expected {len(prompts) * params.max_tokens} output tokens, got {num_tokens}.")
        rates.append(num_tokens / elapsed)
    return rates


def run(args: argparse.Namespace) -> dict:
    llm, result = harness.start_engine_run(args, "structured")
    harness.check_batch_sizes(args.batch_sizes, llm.llm_engine.config.scheduler_config.max_num_seqs)
    rng = np.random.default_rng(args.seed)
    free = SamplingParams(temperature=0.8, seed=args.seed, max_tokens=args.output_len, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.8,
        seed=args.seed,
        max_tokens=args.output_len,
        structured_outputs=StructuredOutputsParams(json=ENDLESS_SCHEMA),
    )
    rows = []
    for batch_size in args.batch_sizes:
        prompts = harness.random_token_ids(rng, harness.prompt_vocab_size(llm), [args.input_len] * batch_size)
        free_rates = _tokens_per_s(llm, prompts, free, args.repeats)
        constrained_rates = _tokens_per_s(llm, prompts, constrained, args.repeats)
        free_tps, constrained_tps = harness.lower_median(free_rates), harness.lower_median(constrained_rates)
        rows.append(
            {
                "batch_size": batch_size,
                "free_output_tokens_per_s": free_tps,
                "json_schema_output_tokens_per_s": constrained_tps,
                "overhead": 1 - constrained_tps / free_tps,
                "free_runs": free_rates,
                "json_schema_runs": constrained_rates,
            }
        )
    result.update(input_len=args.input_len, output_len=args.output_len, repeats=args.repeats, rows=rows)
    return result


def table_row(row: dict) -> list[str]:
    return [
        str(row["batch_size"]),
        harness.with_range(row["free_output_tokens_per_s"], row["free_runs"]),
        harness.with_range(row["json_schema_output_tokens_per_s"], row["json_schema_runs"]),
        harness.fmt(row["overhead"], ".1%"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="Timed runs of each configuration.")
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {args.repeats}.")
    result = run(args)
    harness.print_table(HEADER, [table_row(row) for row in result["rows"]])
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
