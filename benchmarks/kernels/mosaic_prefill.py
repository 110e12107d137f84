"""Prefill attention on a Hopper GPU: vjx's Mosaic GPU paged kernel against its Triton launch,
JAX's unpaged FlashAttention-3 kernel in Mosaic GPU and cuDNN, in one run.

    python -m benchmarks.kernels.mosaic_prefill --out benchmarks/results [--cases "prefill 4k"] \
        [--sweep]

TFLOP/s over causal pairs (4 * pairs * heads * head_dim). Times are CUPTI sums of a call's
kernels, median of 20 calls. `mosaic` is the whole attention call with the Mosaic prefill
launch (decode and padding rows in the Triton launches); `mosaic kernel` is that launch
alone; `triton` the whole call with the Triton prefill launch. Relative errors are against
the Triton call. The yardsticks (unpaged, contiguous K/V) run on the prefill cases only.
"""

import argparse
import dataclasses
import functools
import pathlib
import traceback

import jax
import jax.numpy as jnp

from benchmarks.harness import git_sha, gpu_clocks, versions
from benchmarks.kernels.attention_cases import (
    Case,
    gpu_time_ms,
    make_batch,
    relative_error,
    results_header,
    save_results,
)
from vjx.kernels.paged_prefill_mgpu import MosaicPrefillTuning, paged_prefill_attention
from vjx.kernels.ragged_paged_attention import Scoring, ragged_paged_attention

DTYPE = jnp.bfloat16
CASES = (
    Case("prefill 4k", ((0, 4096),)),
    Case("prefill 8k", ((0, 8192),)),
    Case("prefill 4k page 64", ((0, 4096),), page_size=64),
    Case("prefill 4k d64 mha", ((0, 4096),), num_heads=32, num_kv_heads=32, head_dim=64),
    Case("prefill 4 x 2k", ((0, 2048),) * 4),
    Case("chunks 4 x 1k on 3k", ((3072, 1024),) * 4),
    Case("mixed 64 x 2k decode + 4 x 512 chunks on 1.5k", ((2047, 1),) * 64 + ((1536, 512),) * 4),
)
SWEEP = tuple(
    MosaicPrefillTuning(block_q=64, block_kv=block_kv, stages=stages) for block_kv in (128, 64) for stages in (2, 3, 4)
)


def _calls(batch, mosaic: MosaicPrefillTuning | None):
    md, scoring = batch.md, Scoring(batch.case.head_dim**-0.5)
    args = (batch.q, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs)
    whole = jax.jit(functools.partial(ragged_paged_attention, scoring=scoring, mosaic_prefill=mosaic))
    if mosaic is None:
        return lambda: whole(*args), None
    alone = jax.jit(functools.partial(paged_prefill_attention, sm_scale=scoring.sm_scale, tuning=mosaic))
    return lambda: whole(*args), lambda: alone(*args)


def _rate(case: Case, fn) -> dict:
    try:
        ms, timer = gpu_time_ms(fn)
        return {"ms": ms, "tflop_per_s": case.flops() / (ms * 1e-3) / 1e12, "timer": timer}
    except Exception as error:  # one failing implementation must not end the run
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"[:600]}


def _yardsticks(case: Case) -> dict:
    """JAX's FA3 Mosaic kernel and cuDNN on the same prefill, K/V contiguous (batch of rows)."""
    rows, (context, length) = len(case.rows), case.rows[0]
    if context or any(row != case.rows[0] for row in case.rows):
        return {}
    key = jax.random.key(1)
    found = {}
    try:  # its shared-memory tiles are float16
        from jax.experimental.pallas.ops.gpu import attention_mgpu

        config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=True)
        q16, k16, v16 = (
            jax.random.normal(jax.random.fold_in(key, i), (rows, length, heads, case.head_dim), jnp.float16)
            for i, heads in enumerate((case.num_heads, case.num_kv_heads, case.num_kv_heads))
        )
        found["jax_fa3_mgpu"] = _rate(case, lambda: attention_mgpu.attention(q16, k16, v16, config))
    except Exception as error:
        found["jax_fa3_mgpu"] = {"error": repr(error)[:600]}
    q = jax.random.normal(key, (rows, length, case.num_heads, case.head_dim), DTYPE)
    k = jax.random.normal(jax.random.fold_in(key, 1), (rows, length, case.num_kv_heads, case.head_dim), DTYPE)
    v = jax.random.normal(jax.random.fold_in(key, 2), k.shape, DTYPE)
    cudnn = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation="cudnn"))
    found["cudnn"] = _rate(case, lambda: cudnn(q, k, v))
    return found


def _row(case: Case, sweep: bool) -> dict:
    batch = make_batch(case, DTYPE)
    num_real = sum(n for _, n in case.rows)
    row = {"case": case.name, "gflop": case.flops() / 1e9}
    triton, _ = _calls(batch, None)
    row["triton"] = _rate(case, triton)
    expected = triton()
    for tuning in SWEEP if sweep else SWEEP[:1]:
        label = f"mosaic q{tuning.block_q} kv{tuning.block_kv} s{tuning.stages}"
        whole, alone = _calls(batch, tuning)
        try:
            row[label] = {
                **_rate(case, whole),
                "rel_err_vs_triton": relative_error(whole()[:num_real], expected[:num_real]),
            }
            row[label]["kernel"] = _rate(case, alone)
        except Exception as error:
            traceback.print_exc()
            row[label] = {"error": f"{type(error).__name__}: {error}"[:600]}
    row.update(_yardsticks(case))
    return row


def _cell(entry) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error"
    return f"{entry['tflop_per_s']:.0f} ({entry['ms'] * 1e3:.0f} us)"


def _markdown(results: dict) -> str:
    lines = [
        f"# Prefill attention on {results['device']} ({results['date']})",
        "",
        f"Command: `{results['command']}`; JAX {results['jax']}; SHA {results['git_sha']}.",
        "bf16, Hq 32 / Hkv 8 / D 128, page 16 unless named. TFLOP/s over causal pairs (us): CUPTI sum of",
        "a call's kernels, median of 20.",
        "",
        "| case | Triton call | Mosaic call | Mosaic kernel alone | rel. err vs Triton | JAX FA3 (unpaged) "
        "| cuDNN (unpaged) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["table"]:
        mosaic = [key for key in row if key.startswith("mosaic")]
        best = max(mosaic, key=lambda key: row[key].get("tflop_per_s", 0.0), default=None)
        entry = row.get(best, {})
        error = entry.get("rel_err_vs_triton", float("nan"))
        cells = [_cell(row.get("triton")), f"{_cell(entry)} {best}", _cell(entry.get("kernel")), f"{error:.1e}"]
        cells += [_cell(row.get("jax_fa3_mgpu")), _cell(row.get("cudnn"))]
        lines.append(f"| {row.get('case')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _save(results: dict, out_dir: pathlib.Path) -> None:
    kind = "h200" if "H200" in results["device"] else "h100" if "H100" in results["device"] else "gpu"
    save_results(results, out_dir, f"{results['date']}-{kind}-mosaic-prefill", _markdown(results))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--sweep", action="store_true", help="every tuning of SWEEP on every case")
    args = parser.parse_args(argv)
    results = {
        **results_header("benchmarks.kernels.mosaic_prefill"),
        "sweep": [dataclasses.asdict(t) for t in SWEEP],
        "git_sha": git_sha(),
        "versions": versions(),
        "gpu_clocks": gpu_clocks(),
        "table": [],
    }
    names = [name for name in args.cases.split(",") if name]
    for case in CASES:
        if names and case.name not in names:
            continue
        try:
            results["table"].append(_row(case, args.sweep))
        except Exception as error:
            traceback.print_exc()
            results["table"].append({"case": case.name, "error": repr(error)[:600]})
        _save(results, args.out)
        print(_markdown(results).splitlines()[-1], flush=True)
    print(_markdown(results))
    return results


if __name__ == "__main__":
    main()
