"""Paged attention on the GPU: vjx's Pallas kernels, JAX's shipped Pallas-Triton paged decode
kernel and the pure-jnp reference backend, measured in one run.

    python -m benchmarks.kernels.ragged_paged_attention --out benchmarks/results \
        [--cases "decode 32 x 4k,prefill 4k"] [--forward] [--hlo] \
        [--sweep-stages decode,splits,prefill --sweep-budget-s 150]

Decode is reported in effective TB/s (K/V bytes the step must read / time), prefill and the
mixed batch in TFLOP/s (causal pairs only). Kernel times are CUPTI sums of the kernels each
call launches, median of 20 calls; `backend.forward` (KV write + attention on a donated,
chained cache) is timed by the host clock over pipelined calls. The table runs first with the
shipped knobs, then the optional sweep. Writes `<date>-h200-paged-attention.json` and `.md` to
`--out` after every case, so a run cut off by its time limit keeps what it had.
"""

import argparse
import dataclasses
import functools
import pathlib
import time
import traceback

import jax
import jax.numpy as jnp

from benchmarks.kernels.attention_cases import (
    CASES,
    gpu_time_ms,
    kernel_breakdown_ms,
    make_batch,
    relative_error,
    results_header,
    save_results,
)
from benchmarks.kernels.sweep import ours, sweep
from vjx.attention.pallas_gpu import PallasGpuBackend
from vjx.attention.reference import ReferenceBackend
from vjx.kernels.tuning import default_tuning

DTYPE = jnp.bfloat16
# JAX's kernel at its defaults (k_splits 16, 8 warps, 2 stages) reached 2.1 TB/s on 32 x 4k;
# one stage and fewer splits for many rows, more splits for few rows, did best.
SHIPPED_KNOBS = {"many_rows": {"num_stages": 1, "k_splits": 4}, "few_rows": {"num_stages": 1, "k_splits": 16}}


def _forward(backend, batch, kv_cache):
    """A call of backend.forward (KV write + attention) on a donated cache chained across calls."""
    step = jax.jit(functools.partial(backend.forward, sm_scale=batch.case.head_dim**-0.5), donate_argnums=(3,))
    state = {"kv_cache": kv_cache}

    def call():
        out, state["kv_cache"] = step(batch.q, batch.k, batch.v, state["kv_cache"], batch.md)
        return out

    return call


def _shipped(batch, k_pages, v_pages, knobs):
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    num_rows = len(batch.case.rows)  # it takes one query token per row, no padding
    q, block_tables = batch.q[:num_rows], batch.md.block_tables[:num_rows]
    seq_lens = batch.md.seq_lens[:num_rows]
    return lambda: paged_attention(q, k_pages, v_pages, block_tables, seq_lens, **knobs)


def _rate(case, ms: float) -> dict:
    seconds = ms * 1e-3
    return {
        "ms": ms,
        "tb_per_s": case.kv_bytes(DTYPE) / seconds / 1e12,
        "tflop_per_s": case.flops() / seconds / 1e12,
    }


def _measure(row: dict, label: str, fn, case, is_chained: bool = False) -> None:
    try:
        ms, method = gpu_time_ms(fn, is_chained=is_chained)
        row[label] = {**_rate(case, ms), "timer": method}
    except Exception as error:  # one failing implementation must not end the run
        row[label] = {"error": f"{type(error).__name__}: {error}"[:400]}
        traceback.print_exc()


def _table_row(case, with_forward: bool) -> dict:
    """Every implementation on one case, with our output checked against the reference's."""
    batch = make_batch(case, DTYPE)
    row = {"case": case.name, "kv_gb": case.kv_bytes(DTYPE) / 1e9, "gflop": case.flops() / 1e9}
    ours_fn = ours(batch)
    _measure(row, "ours", ours_fn, case)
    row["ours_kernels"] = kernel_breakdown_ms(ours_fn)
    if with_forward:
        forward_fn = _forward(PallasGpuBackend(), batch, batch.kv_cache + 0)
        _measure(row, "ours_forward", forward_fn, case, is_chained=True)
    if case.is_decode:
        knobs = SHIPPED_KNOBS["many_rows" if len(case.rows) >= 32 else "few_rows"]
        shipped_fn = _shipped(batch, batch.kv_cache[0], batch.kv_cache[1], knobs)
        _measure(row, "jax_shipped", shipped_fn, case)
        row["jax_shipped"]["knobs"] = knobs
    reference_fn = _forward(ReferenceBackend(), batch, jnp.transpose(batch.kv_cache, (0, 2, 3, 1, 4)))
    _measure(row, "reference_forward", reference_fn, case, is_chained=True)
    num_real = sum(num_new for _, num_new in case.rows)
    row["rel_err_vs_reference"] = relative_error(ours_fn()[:num_real], reference_fn()[:num_real])
    return row


def _hlo_copies(case) -> dict:
    """Cache-sized copies in the optimized HLO of the donated backend forward (want none)."""
    batch = make_batch(case, DTYPE)
    step = jax.jit(functools.partial(PallasGpuBackend().forward, sm_scale=0.1), donate_argnums=(3,))
    hlo = step.lower(batch.q, batch.k, batch.v, batch.kv_cache, batch.md).compile().as_text()
    cache_dims = ",".join(str(d) for d in batch.kv_cache.shape)
    lines = [line.strip()[:160] for line in hlo.splitlines() if " copy(" in line and cache_dims in line]
    return {"cache_shape": cache_dims, "cache_copies": lines, "has_alias": "input_output_alias" in hlo}


def _cell(entry, unit: str) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error"
    suffix = " TB/s" if unit == "tb_per_s" else " TFLOP/s"
    return f"{entry[unit]:.2f}{suffix} ({entry['ms'] * 1e3:.0f} us)"


def _markdown(results: dict) -> str:
    lines = [
        f"# Paged attention on {results['device']} ({results['date']})",
        "",
        f"Command: `{results['command']}`; JAX {results['jax']}; bf16, Hq 32 / Hkv 8 / D 128, page 16.",
        "Decode: effective TB/s = K/V bytes the step must read / kernel time. Prefill and mixed:",
        "TFLOP/s over causal pairs. Time = CUPTI sum of the call's kernels, median of 20 calls.",
        "",
        "| case | vjx pallas_gpu | vjx forward (write + attend) | JAX shipped Pallas-Triton "
        "| jnp reference forward | rel. err vs reference |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["table"]:
        unit = "tb_per_s" if row["case"].startswith("decode") else "tflop_per_s"
        labels = ("ours", "ours_forward", "jax_shipped", "reference_forward")
        cells = [_cell(row.get(label), unit) for label in labels]
        if row.get("jax_shipped", {}).get("knobs"):
            cells[2] += f" {row['jax_shipped']['knobs']}"
        error = row.get("rel_err_vs_reference", float("nan"))
        lines.append(f"| {row['case']} | " + " | ".join(cells) + f" | {error:.1e} |")
    lines += ["", "Sweep (ms per call; knobs of the stage's launch):", ""]
    for entry in results.get("sweep", []):
        knobs = entry["tuning"][entry["knob"]]
        lines.append(f"- {entry['case']}: {knobs} -> {entry.get('ms', entry.get('error'))}")
    return "\n".join(lines) + "\n"


def _save(results: dict, out_dir: pathlib.Path) -> None:
    save_results(results, out_dir, f"{results['date']}-h200-paged-attention", _markdown(results))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--forward", action="store_true", help="also time backend.forward")
    parser.add_argument("--sweep-stages", default="", help="comma-separated stages of sweep.STAGES")
    parser.add_argument("--sweep-budget-s", type=float, default=150.0)
    parser.add_argument("--hlo", action="store_true", help="check the forward's HLO for cache copies")
    args = parser.parse_args(argv)
    results = {
        **results_header("benchmarks.kernels.ragged_paged_attention"),
        "default_tuning": dataclasses.asdict(default_tuning(128, DTYPE)),
        "table": [],
    }
    started = time.perf_counter()
    if args.hlo:
        results["hlo"] = _hlo_copies(CASES[0])
    names = [name for name in args.cases.split(",") if name]
    for case in CASES:
        if names and case.name not in names:
            continue
        try:
            results["table"].append(_table_row(case, args.forward))
        except Exception as error:
            traceback.print_exc()
            results["table"].append({"case": case.name, "error": repr(error)[:400]})
        _save(results, args.out)
    stages = [stage for stage in args.sweep_stages.split(",") if stage]
    if stages:
        sweep(results, stages, args.sweep_budget_s, lambda: _save(results, args.out))
    results["total_s"] = time.perf_counter() - started
    _save(results, args.out)
    print(_markdown(results))
    return results


if __name__ == "__main__":
    main()
