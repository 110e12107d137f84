"""Plots of benchmark JSON results as PNG files.

    python -m benchmarks.plot RESULT.json|DIR ... [--output-dir DIR]

Reads every latency and throughput result given (a directory: its *.json files) and writes:
- `latency.png`: whole-batch latency (mean, p10-p90 bars) and the mean decode step against
  batch size, one line per engine and (input, output) length;
- `throughput.png`: output tokens/s of each run, one bar per engine and workload.
Other JSON files are ignored. matplotlib is not a dependency of vjx: without it this prints
a message and exits 0 without plotting (it is installed on the GPU machine).
"""

import argparse
import json
import pathlib
import sys

from benchmarks.harness import workload_label


def load_results(paths: list[str]) -> list[dict]:
    """Latency and throughput results from files and directories, in name order."""
    files = []
    for path in map(pathlib.Path, paths):
        files.extend(sorted(path.glob("*.json")) if path.is_dir() else [path])
    results = []
    for file in files:
        with open(file) as f:
            result = json.load(f)
        if isinstance(result, dict) and result.get("benchmark") in ("latency", "throughput"):
            results.append(result)
    return results


def latency_series(results: list[dict]) -> dict[str, list[dict]]:
    """Latency runs grouped by line label, each line sorted by batch size."""
    series: dict[str, list[dict]] = {}
    for result in results:
        if result["benchmark"] != "latency":
            continue
        for run in result["runs"]:
            cache = " static cache" if result.get("cache_implementation") == "static" else ""
            label = f"{result['engine']}{cache} ({run['input_len']} in, {run['output_len']} out)"
            series.setdefault(label, []).append(run)
    return {label: sorted(runs, key=lambda r: r["batch_size"]) for label, runs in series.items()}


def _plot_latency(plt, series: dict[str, list[dict]], path: pathlib.Path) -> None:
    fig, (ax_batch, ax_step) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, runs in series.items():
        sizes = [r["batch_size"] for r in runs]
        means = [r["latency_s"] for r in runs]
        bars = [[m - r["p10_s"] for m, r in zip(means, runs)], [r["p90_s"] - m for m, r in zip(means, runs)]]
        ax_batch.errorbar(sizes, means, yerr=bars, marker="o", capsize=3, label=label)
        steps = [(r["batch_size"], r["decode_step_s"] * 1e3) for r in runs if r.get("decode_step_s")]
        if steps:
            ax_step.plot(*zip(*steps), marker="o", label=label)
    ax_batch.set(xlabel="batch size", ylabel="whole-batch latency (s)", title="latency (mean, p10-p90)")
    ax_step.set(xlabel="batch size", ylabel="decode step (ms)", title="mean decode step")
    for ax in (ax_batch, ax_step):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_throughput(plt, results: list[dict], path: pathlib.Path) -> None:
    labels = [f"{r['engine']}: {workload_label(r)}" for r in results]
    values = [r["output_tok_per_s"] for r in results]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(results)))
    engines = sorted({r["engine"] for r in results})
    colors = [f"C{engines.index(r['engine'])}" for r in results]
    ax.barh(range(len(values)), values, color=colors)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    for i, value in enumerate(values):
        ax.text(value, i, f" {value:,.0f}", va="center", fontsize=8)
    ax.set(xlabel="output tokens/s", title="throughput")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(results: list[dict], output_dir: pathlib.Path) -> list[pathlib.Path]:
    """Writes the PNG files there is data for; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    series = latency_series(results)
    if series:
        written.append(output_dir / "latency.png")
        _plot_latency(plt, series, written[-1])
    throughputs = [r for r in results if r["benchmark"] == "throughput"]
    if throughputs:
        written.append(output_dir / "throughput.png")
        _plot_throughput(plt, throughputs, written[-1])
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="Result JSON files or directories of them.")
    parser.add_argument("--output-dir", default=".", help="Where the PNG files go.")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot: matplotlib is not installed; skipping the plots (pip install matplotlib).")
        return 0
    results = load_results(args.paths)
    for path in plot(results, pathlib.Path(args.output_dir)):
        print(f"plot: wrote {path}")
    if not results:
        print("plot: no latency or throughput results found.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
