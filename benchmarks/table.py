"""One markdown table of latency and throughput results, each figure the median of its runs
with the min and max: the form of the H200 table (issue #30).

    python -m benchmarks.table RESULT.json|DIR ... [--output FILE]

Reads every latency and throughput result given (a directory: its *.json files, in name order)
and prints, for each, the engine, the model, the engine arguments that set the row apart
(quantization, KV cache dtype, max_num_seqs, max_num_batched_tokens), and then:
- latency rows: prompt and output lengths, batch, temperature, median whole-batch seconds (min, max), the mean decode
  step and its fraction of the HBM floor;
- throughput rows: the workload, median output tok/s (min, max), requests/s and total tok/s.
Below the tables, where each result came from: device, commit, JAX and the GPU clocks read at
its start.
"""

import argparse
import pathlib
import sys

from benchmarks.harness import fmt, workload_label
from benchmarks.plot import load_results

CONFIG_ARGS = {
    "quantization": "{}",
    "kv_cache_dtype": "kv {}",
    "max_num_seqs": "max_num_seqs {}",
    "max_num_batched_tokens": "budget {}",
}
"""The engine arguments a row is told apart by, and how each reads in the table."""
LATENCY_HEADER = ["engine", "model", "config", "in / out", "batch", "temp", "median s", "min s", "max s"]
LATENCY_HEADER += ["step ms", "HBM"]
THROUGHPUT_HEADER = ["engine", "model", "config", "workload", "output tok/s", "min", "max", "req/s", "total tok/s"]


def config_label(result: dict) -> str:
    args = result.get("engine_args", {})
    parts = [form.format(args[name]) for name, form in CONFIG_ARGS.items() if name in args]
    return ", ".join(parts) or "defaults"


def _row_start(result: dict) -> list[str]:
    return [result["engine"], pathlib.PurePath(result["model"]).name, config_label(result)]


def latency_rows(result: dict) -> list[list[str]]:
    rows = []
    for run in result["runs"]:
        latencies = run.get("latencies_s") or [run["latency_s"]]
        step_ms = None if run.get("decode_step_s") is None else run["decode_step_s"] * 1e3
        rows.append(
            [
                *_row_start(result),
                f"{run['input_len']} / {run['output_len']}",
                str(run["batch_size"]),
                fmt(run.get("temperature"), "g"),
                fmt(run.get("p50_s", run["latency_s"])),
                fmt(min(latencies)),
                fmt(max(latencies)),
                fmt(step_ms, ".2f"),
                fmt(run.get("decode_hbm_fraction"), ".1%"),
            ]
        )
    return rows


def throughput_row(result: dict) -> list[str]:
    rate = result["output_tok_per_s"]
    return [
        *_row_start(result),
        workload_label(result),
        fmt(rate, ",.0f"),
        fmt(result.get("output_tok_per_s_min", rate), ",.0f"),
        fmt(result.get("output_tok_per_s_max", rate), ",.0f"),
        fmt(result["requests_per_s"], ".2f"),
        fmt(result["total_tok_per_s"], ",.0f"),
    ]


def provenance(result: dict) -> str:
    clocks = result.get("gpu_clocks") or []
    clock = f", SM {clocks[0]['clocks.sm']} / memory {clocks[0]['clocks.mem']} MHz" if clocks else ""
    versions = result.get("versions", {})
    return (
        f"- {result['benchmark']} ({config_label(result)}): {result['device']}, {result['date']}, "
        f"commit {result.get('git_sha', 'unknown')}, JAX {versions.get('jax', '?')}{clock}"
    )


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def render(results: list[dict]) -> str:
    latency = [row for r in results if r["benchmark"] == "latency" for row in latency_rows(r)]
    throughput = [throughput_row(r) for r in results if r["benchmark"] == "throughput"]
    lines = []
    if latency:
        lines += _markdown(LATENCY_HEADER, latency) + [""]
    if throughput:
        lines += _markdown(THROUGHPUT_HEADER, throughput) + [""]
    lines += ["Where each result came from:", ""] + [provenance(r) for r in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="Result JSON files or directories of them.")
    parser.add_argument("--output", default=None, help="Also write the table to this file.")
    args = parser.parse_args(argv)
    results = load_results(args.paths)
    if not results:
        raise ValueError(f"no latency or throughput results in {args.paths}.")
    text = render(results)
    print(text, end="")
    if args.output:
        pathlib.Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
