"""`vjx bench NAME [args...]`: runs one benchmark's `main(argv)`.

    vjx bench latency [args...]      benchmarks.latency
    vjx bench throughput [args...]   benchmarks.throughput
    vjx bench serve [args...]        benchmarks.serve (load generator for a running server)
    vjx bench roofline [args...]     benchmarks.roofline
    vjx bench plot [args...]         benchmarks.plot
    vjx bench hf [args...]           benchmarks.baselines.hf_transformers

Each module is imported only when chosen, so `serve` needs no JAX and `hf` no vjx engine.
"""

import importlib
import sys

BENCHMARKS = {
    "latency": "benchmarks.latency",
    "throughput": "benchmarks.throughput",
    "serve": "benchmarks.serve",
    "roofline": "benchmarks.roofline",
    "plot": "benchmarks.plot",
    "hf": "benchmarks.baselines.hf_transformers",
}


def main(argv: list[str]) -> int:
    """Dispatches `argv[0]` to that benchmark's `main(argv[1:])`; 2 on a bad name."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"vjx bench: benchmark must be one of {', '.join(BENCHMARKS)}, got {name!r}.", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[name])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
