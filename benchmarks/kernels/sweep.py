"""The knob sweep of the ragged paged attention kernels, one stage per launch kind.

Stages run in order, each starting from the best knobs so far: decode tiles on 32 x 4k,
the split target on 4 x 32k, prefill tiles on a 4k prefill. Configurations are ordered most
promising first, and the sweep stops at its time budget (compiles dominate it).
"""

import dataclasses
import functools
import time
import traceback

import jax
import jax.numpy as jnp

from benchmarks.kernels.attention_cases import CASES, gpu_time_ms, make_batch
from vjx.kernels.ragged_paged_attention import Scoring, ragged_paged_attention
from vjx.kernels.tuning import AttentionTuning, KernelTuning, default_tuning

DTYPE = jnp.bfloat16


def ours(batch, tuning: AttentionTuning | None = None):
    """A call of vjx's kernels (all three launches) on `batch`."""
    md = batch.md
    scoring = Scoring(batch.case.head_dim**-0.5)
    interpret = jax.default_backend() != "gpu"  # CPU smoke runs of tiny cases
    fn = jax.jit(functools.partial(ragged_paged_attention, scoring=scoring, tuning=tuning, interpret=interpret))
    args = (batch.q, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs)
    return lambda: fn(*args)


def _decode_tiles(best: AttentionTuning):
    for num_stages in (2, 1, 3):
        for block_k in (64, 128, 32):
            for num_warps in (4, 8):
                decode = KernelTuning(16, block_k, num_warps, num_stages)
                yield dataclasses.replace(best, decode=decode)


def _split_targets(best: AttentionTuning):
    for decode_programs, max_kv_splits in ((64, 16), (128, 16), (128, 32), (256, 32), (32, 16)):
        yield dataclasses.replace(best, decode_programs=decode_programs, max_kv_splits=max_kv_splits)


def _prefill_tiles(best: AttentionTuning):
    grid = (
        (128, 64, 8, 2),
        (128, 64, 8, 3),
        (128, 128, 8, 2),
        (64, 64, 4, 3),
        (128, 32, 8, 2),
        (64, 64, 4, 2),
        (128, 64, 4, 2),
        (64, 128, 4, 2),
        (128, 64, 8, 1),
        (64, 32, 4, 2),
        (128, 32, 4, 3),
        (256, 32, 8, 2),
    )
    for block_m, block_k, num_warps, num_stages in grid:
        yield dataclasses.replace(best, prefill=KernelTuning(block_m, block_k, num_warps, num_stages))


# name -> (case, the knob it varies, candidates given the best knobs so far)
STAGES = {
    "decode": ("decode 32 x 4k", "decode", _decode_tiles),
    "splits": ("decode 4 x 32k", "decode_programs", _split_targets),
    "prefill": ("prefill 4k", "prefill", _prefill_tiles),
}


def sweep(results: dict, stages: list[str], budget_s: float, save) -> AttentionTuning:
    """Best knobs found within `budget_s` over `stages` (names of STAGES, run in that order);
    every measurement lands in results["sweep"]."""
    start = time.perf_counter()
    results["sweep"] = []
    best = default_tuning(128, DTYPE)
    cases = {case.name: case for case in CASES}
    measured = {row["case"]: row["ours"]["ms"] for row in results["table"] if "ms" in row.get("ours", {})}
    for case_name, knob, candidates in (STAGES[stage] for stage in stages):
        batch = make_batch(cases[case_name], DTYPE)
        # The table already timed the defaults on this case: only alternatives are compiled.
        timings = [(measured[case_name], best)] if case_name in measured else []
        for tuning in candidates(best):
            if time.perf_counter() - start > budget_s:
                break
            if timings and tuning == best:
                continue
            entry = {"case": case_name, "knob": knob, "tuning": dataclasses.asdict(tuning)}
            try:
                entry["ms"], entry["timer"] = gpu_time_ms(ours(batch, tuning), iterations=10)
                timings.append((entry["ms"], tuning))
            except Exception as error:  # a configuration Triton rejects is a data point
                entry["error"] = f"{type(error).__name__}: {error}"[:300]
                traceback.print_exc(limit=2)
            results["sweep"].append(entry)
            print("sweep", case_name, entry.get("ms", entry.get("error")), getattr(tuning, knob), flush=True)
        if timings:
            best = min(timings, key=lambda t: t[0])[1]
        results["best_tuning"] = dataclasses.asdict(best)
        save()
        del batch
    return best
