"""XLA:CPU's GEMMs at decode row counts, with YNNPACK fusion on (XLA's default) and off (Eigen's
dot), per executable through `compiler_options`: the measurement behind
`vjx.worker.step_layout.compiler_options` (YNNPACK off for the CPU's decode buckets).

    python -m benchmarks.kernels.cpu_gemm --shapes 576x960 576x3072 1536x576 \
        --rows 1 8 64 512 [--layers 30] [--output-json cpu_gemm.json]

Each shape gets `--layers` distinct random float32 weights (together larger than the CPU's
caches, as a model's layers are), and each case times a pass of `rows x in` by every weight in
turn. The table gives ms per weight (the best of `--repeats` passes) and the weight bytes
streamed per second.
"""

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from vjx.worker.step_layout import YNN_FUSION_OFF

HEADER = ["shape (in x out)", "rows", "ynn on ms", "ynn off ms", "ynn on GB/s", "ynn off GB/s"]


def _parse_shape(text: str) -> tuple[int, int]:
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shapes must read INxOUT with positive sizes, got {text!r}.")
    return int(parts[0]), int(parts[1])


def time_pass(compiled, rows: jax.Array, weights: list[jax.Array], repeats: int) -> float:
    """Seconds per weight of the best of `repeats` passes over every weight."""
    for w in weights:
        compiled(rows, w).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = [compiled(rows, w) for w in weights]
        for out in outputs:
            out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / len(weights))
    return best


def run_case(shape: tuple[int, int], num_rows: int, weights: list[jax.Array], repeats: int) -> dict:
    rows = jnp.asarray(np.random.default_rng(1).standard_normal((num_rows, shape[0])), jnp.float32)
    lowered = jax.jit(lambda x, w: x @ w).lower(rows, weights[0])
    on = time_pass(lowered.compile(), rows, weights, repeats)
    off = time_pass(lowered.compile(compiler_options=YNN_FUSION_OFF), rows, weights, repeats)
    weight_bytes = shape[0] * shape[1] * 4
    return {
        "in": shape[0],
        "out": shape[1],
        "rows": num_rows,
        "ynn_on_s": on,
        "ynn_off_s": off,
        "ynn_on_gb_per_s": weight_bytes / on / 1e9,
        "ynn_off_gb_per_s": weight_bytes / off / 1e9,
    }


def table_row(case: dict) -> list[str]:
    return [
        f"{case['in']}x{case['out']}",
        str(case["rows"]),
        f"{case['ynn_on_s'] * 1e3:.3f}",
        f"{case['ynn_off_s'] * 1e3:.3f}",
        f"{case['ynn_on_gb_per_s']:.1f}",
        f"{case['ynn_off_gb_per_s']:.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["576x960", "576x576", "576x3072", "1536x576"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--layers", type=int, default=30, help="Distinct weights of each shape.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    shapes = [_parse_shape(text) for text in args.shapes]
    for name, values in [("rows", args.rows), ("layers", [args.layers]), ("repeats", [args.repeats])]:
        if min(values) < 1:
            raise ValueError(f"{name} must be >= 1, got {min(values)}.")
    platform_name, device = harness.jax_device()
    result = harness.run_metadata("cpu_gemm", "xla", platform_name, device, "-")
    rng = np.random.default_rng(0)
    result["cases"] = []
    harness.print_header(HEADER)
    for shape in shapes:
        weights = [jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(args.layers)]
        for num_rows in args.rows:
            case = run_case(shape, num_rows, weights, args.repeats)
            result["cases"].append(case)
            harness.print_row(table_row(case))
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
