"""Device time of the jitted sampler: `sample` (and `compute_logprobs`) on one batch of logits.

    python -m benchmarks.sampler --num-rows 256 --vocab-size 128256 --repeats 5

Each case builds its `SamplingMetadata` on the device, compiles `jax.jit(sample)` ahead of
time (the compile time is reported too), runs it once untimed, then `--repeats` times; the
table shows the median and the fastest run in ms. The logits are float32 normals x 4, every
row samples with the same parameters, and the histories (prompt + output tokens, for the
penalties and bad words) are random ids, `--history-len` columns, the last quarter output.
Every timed program (the `jnp.argmax alone` floor too) starts by writing the logits out
(x 1.0, behind an optimization barrier), as the model step's LM head does: a plain
argument would make XLA copy the logits before the processors' `lax.cond`s, a pass the
step does not pay when no processor runs.

It measures the default JAX backend: on a GPU machine (e.g. the H200) the same command
times the GPU, and the JSON's `device` field says which one ran. Prints one table and
writes JSON to `--output-json`.
"""

import argparse
import dataclasses
import datetime
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from vjx.sampling.logprobs import compute_logprobs
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling.sampler import sample
from vjx.worker.step_inputs import STEP_INPUTS

_NUM_LOGPROBS = 20
_FILTERS = dict(temperature=0.8, top_k=50, top_p=0.9)
_PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1)
_CASES = {
    # name: (per-row fields, extra processors on, all_greedy); "static" cases also tell the
    # sampler that no row filters or processes (the runner's flags for such a batch).
    "greedy (static all_greedy)": (dict(temperature=0.0), False, True),
    "temperature only (static: no filter, no processor)": (dict(temperature=0.8), False, False),
    "greedy (all rows at run time)": (dict(temperature=0.0), False, False),
    "temperature only": (dict(temperature=0.8), False, False),
    "top-k 50 + top-p 0.9": (_FILTERS, False, False),
    "top-k + top-p + min-p 0.05": (dict(_FILTERS, min_p=0.05), False, False),
    "top-k + top-p + penalties": (dict(_FILTERS, **_PENALTIES), False, False),
    "greedy + penalties": (dict(temperature=0.0, **_PENALTIES), False, False),
    "top-k + top-p + every processor": (dict(_FILTERS, **_PENALTIES), True, False),
}


def _metadata(args: argparse.Namespace, fields: dict, has_masks: bool, all_greedy: bool) -> SamplingMetadata:
    """Every row alike; `has_masks` turns on logit bias, bad words and min_tokens as well."""
    rng = np.random.default_rng(args.seed)
    r, v, history_len = args.num_rows, args.vocab_size, args.history_len
    neutral = dict(
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
    )
    per_row = {
        name: np.full(r, fields.get(name, value), np.int32 if name == "top_k" else np.float32)
        for name, value in neutral.items()
    }
    bias = np.zeros((r, v), np.float32)
    bad_words = np.full((r, 4, 3), -1, np.int32)
    if has_masks:
        bias[:, rng.integers(0, v, 64)] = 2.0
        bad_words[:, :, 1:] = rng.integers(0, v, (r, 4, 2))
    md = STEP_INPUTS.sampling_metadata_class(
        **per_row,
        seeds=np.arange(r, dtype=np.int32),
        sample_positions=np.full(r, history_len // 4, np.int32),
        token_ids=rng.integers(0, v, (r, history_len)).astype(np.int32),
        num_prompt_tokens=np.full(r, history_len - history_len // 4, np.int32),
        num_tokens=np.full(r, history_len, np.int32),
        logit_bias=bias,
        logit_bias_rows=np.arange(r, dtype=np.int32),
        has_logit_bias=np.full(r, has_masks),
        stop_token_ids=np.tile(np.array([2, 7], np.int32), (r, 1)),
        is_below_min_tokens=np.full(r, has_masks),
        bad_words=bad_words,
        all_greedy=all_greedy,
    )
    return jax.device_put(md)


def _time(fn, logits: jax.Array, other: tuple, repeats: int) -> dict:
    """Compile seconds, then the median and fastest of `repeats` timed runs (ms)."""

    def from_a_temporary(x, scale, *rest):
        return fn(jax.lax.optimization_barrier(x * scale), *rest)

    arguments = (logits, jnp.float32(1.0), *other)
    start = time.perf_counter()
    compiled = jax.jit(from_a_temporary).lower(*arguments).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*arguments))
    times_ms = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*arguments))
        times_ms.append((time.perf_counter() - start) * 1e3)
    return {
        "median_ms": statistics.median(times_ms),
        "min_ms": min(times_ms),
        "compile_s": compile_s,
        "times_ms": times_ms,
    }


def run(args: argparse.Namespace) -> dict:
    logits = jax.device_put(
        (np.random.default_rng(args.seed).normal(size=(args.num_rows, args.vocab_size)) * 4).astype(np.float32)
    )
    # The floor every greedy case is measured against: one read of the logits.
    results = {"jnp.argmax alone (reference)": _time(lambda x: jnp.argmax(x, axis=-1), logits, (), args.repeats)}
    for name, (fields, has_masks, all_greedy) in _CASES.items():
        md = _metadata(args, fields, has_masks, all_greedy)
        if "static" in name:
            md = dataclasses.replace(md, may_filter=False, may_process=False)
        results[name] = _time(sample, logits, (md,), args.repeats)
        print(f"{name}: {results[name]['median_ms']:.2f} ms", file=sys.stderr)
    chosen = jnp.zeros(args.num_rows, jnp.int32)
    results[f"compute_logprobs (k={_NUM_LOGPROBS})"] = _time(
        lambda x, ids: compute_logprobs(x, ids, _NUM_LOGPROBS), logits, (chosen,), args.repeats
    )
    return {
        "date": datetime.date.today().isoformat(),
        "host": harness.host_description(),
        "device": f"{jax.devices()[0].platform}: {jax.devices()[0].device_kind}",
        "jax": jax.__version__,
        "command": " ".join(["python -m benchmarks.sampler"] + sys.argv[1:]),
        **{k: v for k, v in vars(args).items() if k != "output_json"},
        "results": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-rows", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=128256)
    parser.add_argument("--history-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    result = run(args)
    harness.print_table(
        [
            f"case ({result['num_rows']} rows x {result['vocab_size']} vocab, {result['device']})",
            "median ms",
            "min ms",
            "compile s",
        ],
        [
            [name, f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['compile_s']:.1f}"]
            for name, r in result["results"].items()
        ],
    )
    harness.write_json(args.output_json, result)


if __name__ == "__main__":
    main()
