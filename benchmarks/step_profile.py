r"""Step profile: where a decode step's device time goes, kernel by kernel, and how busy the
device is while the engine runs.

For each `--batch-size`, a batch of random prompts (`--input-len` tokens, each generating
`--output-len`, ignore_eos, temperature 1) is added to one in-process engine, which steps until
every request has its first token (the prefill is done); `jax.profiler` then traces the next
`--num-steps` engine steps (decode only), and the trace's device events give, per step:
- `busy`: the kernels' time, split into projection GEMMs (`gemm_fusion_*`, `nvjet_*`, cuBLAS),
  attention (the Pallas kernels), the KV write (the scatter) and everything else;
- `wall`: the engine's time, `busy / wall` the fraction of it the device runs kernels. Where it
  is below 1 the device waits (for the host, or between kernels): what multi-step decode or
  CUDA graphs could win back, at most.
Python calls are not traced (that would slow the host several times over); the profiler's
remaining host work still makes `wall` an upper bound. The top kernels by time are listed
under the table. On a CPU there are no device events: the "kernels" are XLA:CPU's top-level
ops (a loop with its body counts once, as the loop), grouped as the library GEMM fusions,
the loops (the `cpu` attention backend's walks, their own GEMMs inside), the KV write's
scatter and the rest; `busy` is the executor threads' time in them.

    PYTHONPATH=. python3 -m benchmarks.step_profile --model benchmarks/configs/llama-3.1-8b \
        --tokenizer .carry/smollm2 --load-format dummy --dtype bfloat16 --max-model-len 2048 \
        --batch-size 1 8 64 256 --output-json step_profile.json
"""

import argparse
import collections
import glob
import gzip
import json
import sys
import tempfile
import time

import jax
import numpy as np

from benchmarks import harness
from vjx import EngineArgs, SamplingParams

GROUPS = (
    ("gemm", ("gemm", "nvjet", "cublas", "cutlass", "xmma")),
    ("attention", ("decode_kernel", "prefill_kernel", "attention")),
    ("kv_write", ("scatter",)),
)
HEADER = ["batch", "steps", "wall ms", "busy ms", "busy %", "gemm ms", "attention ms", "kv_write ms", "other ms"]
NUM_TOP_KERNELS = 12


def kernel_group(name: str, groups=GROUPS) -> str:
    lowered = name.lower()
    for group, markers in groups:
        if any(marker in lowered for marker in markers):
            return group
    return "other"


CPU_GROUPS = (
    ("gemm", ("ynn", "xnn", "onednn", "dot")),
    ("attention", ("while", "cond")),
    ("kv_write", ("scatter",)),
)
"""XLA:CPU's top-level ops by group: the library GEMM fusions, the loops (on the CPU the
attention's walks over rows and key chunks are `while`/`cond` ops, with their own GEMMs inside),
the KV write."""


def _trace_events(trace_dir: str) -> list[dict]:
    events = []
    for path in glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True):
        with gzip.open(path) as f:
            trace = json.load(f)
        events.extend(trace["traceEvents"] if isinstance(trace, dict) else trace)
    return events


def device_kernel_us(trace_dir: str, on_cpu: bool = False) -> dict[str, list[float]]:
    """{kernel name: [total us, calls]} over the trace's device (GPU/TPU) events, or with
    `on_cpu` over XLA's top-level ops (`cpu_top_level_ops`)."""
    events = _trace_events(trace_dir)
    if on_cpu:
        kernels = cpu_top_level_ops(events)
    else:
        devices = {
            e["pid"]
            for e in events
            if e.get("ph") == "M"
            and e.get("name") == "process_name"
            and str(e["args"].get("name", "")).startswith(("/device:GPU", "/device:TPU"))
        }
        kernels = [e for e in events if e.get("ph") == "X" and e.get("pid") in devices]
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        totals[e["name"]][0] += e.get("dur", 0.0)
        totals[e["name"]][1] += 1
    return totals


def cpu_top_level_ops(events: list[dict]) -> list[dict]:
    """XLA:CPU's ops (events naming an `hlo_op`) that no other op on their thread encloses: a
    loop's body ops count inside the loop, once."""
    ops = sorted(
        (e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})),
        key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0.0)),
    )
    top, open_end, thread = [], -1.0, None
    for e in ops:
        if (e["pid"], e["tid"]) != thread:
            thread, open_end = (e["pid"], e["tid"]), -1.0
        if e["ts"] >= open_end:
            top.append(e)
            open_end = e["ts"] + e.get("dur", 0.0)
    return top


def _trace_options() -> jax.profiler.ProfileOptions:
    """Device activity and the runtime's own host events, without tracing every Python call
    (which slows the host several times over and would make a host-bound step look worse)."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    return options


def run_batch(llm, args: argparse.Namespace, batch_size: int, rng) -> dict:
    """Prefill a batch, trace `num_steps` decode steps, finish the batch; the step's profile."""
    engine = llm.llm_engine
    ids = harness.random_token_ids(rng, harness.prompt_vocab_size(llm), [args.input_len] * batch_size)
    params = SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=args.output_len)
    request_ids = [f"profile-{batch_size}-{i}" for i in range(batch_size)]
    for request_id, row in zip(request_ids, ids):
        engine.add_request(request_id, {"prompt_token_ids": row}, params)
    started: set[str] = set()
    while len(started) < batch_size:
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    with tempfile.TemporaryDirectory() as scratch_dir:
        trace_dir = f"{args.trace_dir}/batch{batch_size}" if args.trace_dir else scratch_dir
        jax.profiler.start_trace(trace_dir, profiler_options=_trace_options())
        start = time.perf_counter()
        for _ in range(args.num_steps):
            engine.step()
        wall_s = time.perf_counter() - start
        jax.profiler.stop_trace()
        on_cpu = jax.default_backend() == "cpu"
        kernels = device_kernel_us(trace_dir, on_cpu)
    while engine.has_unfinished_requests():
        engine.step()
    return summarize(batch_size, args.num_steps, wall_s, kernels, CPU_GROUPS if on_cpu else GROUPS)


def summarize(batch_size: int, num_steps: int, wall_s: float, kernels: dict[str, list[float]], markers=GROUPS) -> dict:
    """The step's profile from its kernels' totals; `markers` name each group's kernels
    (`GROUPS` on a GPU or TPU, `CPU_GROUPS` on a CPU)."""
    groups = collections.defaultdict(float)
    for name, (total_us, _) in kernels.items():
        groups[kernel_group(name, markers)] += total_us / num_steps / 1e3
    busy_ms = sum(groups.values()) if kernels else None
    wall_ms = wall_s / num_steps * 1e3
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[:NUM_TOP_KERNELS]
    return {
        "batch_size": batch_size,
        "num_steps": num_steps,
        "wall_ms_per_step": wall_ms,
        "busy_ms_per_step": busy_ms,
        "busy_fraction": busy_ms / wall_ms if busy_ms is not None else None,
        "group_ms_per_step": {group: groups[group] for group, _ in (*GROUPS, ("other", ()))},
        "top_kernels": [
            {"name": name, "us_per_step": total / num_steps, "calls_per_step": calls / num_steps}
            for name, (total, calls) in top
        ],
    }


def table_row(run: dict) -> list[str]:
    groups = run["group_ms_per_step"] if run["busy_ms_per_step"] is not None else {}
    busy = run["busy_fraction"]
    return [
        str(run["batch_size"]),
        str(run["num_steps"]),
        harness.fmt(run["wall_ms_per_step"], ".2f"),
        harness.fmt(run["busy_ms_per_step"], ".2f"),
        harness.fmt(busy * 100 if busy is not None else None, ".1f"),
        *(harness.fmt(groups.get(group), ".2f") for group in ("gemm", "attention", "kv_write", "other")),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-steps", type=int, default=32, help="Decode steps traced per batch.")
    parser.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=[1, 8, 64, 256],
        help="One or more batch sizes, run in order on one engine.",
    )
    parser.add_argument("--output-json", default=None)
    parser.add_argument(
        "--trace-dir",
        default=None,
        help="Keep each batch's trace under DIR/batch<N> (Perfetto/TensorBoard) for a timeline.",
    )
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    for name in ("input_len", "num_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}.")
    if args.output_len < args.num_steps + 2:
        raise ValueError(
            f"output_len must be >= num_steps + 2 ({args.num_steps + 2}), so every traced "
            f"step decodes the whole batch; got {args.output_len}."
        )
    harness.check_batch_sizes(args.batch_size, args.max_num_seqs)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    llm, result = harness.start_engine_run(args, "step_profile")
    config = llm.llm_engine.config
    result.update(
        {
            "input_len": args.input_len,
            "output_len": args.output_len,
            "async_scheduling": config.scheduler_config.async_scheduling,
            "runs": [],
        }
    )
    rng = np.random.default_rng(args.seed)
    print(
        f"step profile: {result['device']}, {config.model_config.model}, {args.input_len} in, "
        f"{args.num_steps} decode steps traced",
        flush=True,
    )
    harness.print_header(HEADER)
    for batch_size in args.batch_size:
        run = run_batch(llm, args, batch_size, rng)
        result["runs"].append(run)
        harness.print_row(table_row(run))
        harness.write_json(args.output_json, result)
    for run in (run for run in result["runs"] if run["top_kernels"]):
        print(f"\nbatch {run['batch_size']}: top kernels")
        harness.print_table(
            ["kernel", "us/step", "calls/step"],
            [[k["name"][:70], f"{k['us_per_step']:.1f}", f"{k['calls_per_step']:.1f}"] for k in run["top_kernels"]],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
