"""The harness every engine benchmark shares: an in-process engine with its start-up times,
seeded random prompts, the run's metadata, one printed markdown table and the JSON file.

A result is a dict: the metadata of `run_metadata` (benchmark, engine, date, platform,
device, command, model, and the provenance a skeptic asks for: the git SHA, the JAX / jaxlib /
Flax / CUDA versions and the GPU's clocks read at the start), the engine arguments that differ
from the defaults, the workload's arguments, and the benchmark's own fields.

The SHA is `git rev-parse HEAD` where the checkout has its git directory, else the
`VJX_GIT_SHA` environment variable (the device machine gets a copy of the tree without it).
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import numpy as np

# Every vjx result names its engine so plots and tables can put baselines beside it.
ENGINE_NAME = "vjx"


def run_metadata(benchmark: str, engine: str, platform_name: str, device: str, model: str) -> dict:
    """Date, device and the exact command line: what makes a result file reproducible."""
    return {
        "benchmark": benchmark,
        "engine": engine,
        "date": datetime.date.today().isoformat(),
        "platform": platform_name,
        "device": device,
        "host": host_description(),
        "command": " ".join([sys.executable, *sys.argv]),
        "argv": list(sys.argv),
        "model": model,
        "git_sha": git_sha(),
        "versions": versions(),
        "gpu_clocks": gpu_clocks(),
    }


def git_sha() -> str:
    """`VJX_GIT_SHA` (set it where the tree was copied without its history), the checkout's
    commit (with `+dirty` when tracked files differ), or "unknown"."""
    if os.environ.get("VJX_GIT_SHA"):
        return os.environ["VJX_GIT_SHA"]
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        sha = None
    if sha is None or sha.returncode != 0:
        return "unknown"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def versions() -> dict:
    """Python, JAX, jaxlib, Flax, and the CUDA / driver versions when a GPU backs JAX."""
    import flax
    import jax
    import jaxlib

    found = {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__}
    found["flax"] = flax.__version__
    if jax.default_backend() == "gpu":
        found["gpu_platform"] = jax.devices()[0].client.platform_version
    return found


def gpu_clocks() -> list[dict] | None:
    """Each GPU's SM and memory clocks (current and maximum, MHz) and driver from
    `nvidia-smi`, read now; None where there is no nvidia-smi."""
    fields = ["name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem"]
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [dict(zip(fields, (v.strip() for v in line.split(",")))) for line in out.stdout.splitlines() if line]


def engine_arguments(engine_args) -> dict:
    """The engine arguments that differ from `EngineArgs`'s defaults."""
    import dataclasses

    defaults = type(engine_args)()
    return {
        f.name: getattr(engine_args, f.name)
        for f in dataclasses.fields(engine_args)
        if getattr(engine_args, f.name) != getattr(defaults, f.name)
    }


def host_description() -> str:
    """The CPU model (from /proc/cpuinfo where there is one), core count and Python."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    cpu = names[0] if names else platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"


def jax_device() -> tuple[str, str]:
    """(platform, device kind) of JAX's first device, e.g. ("gpu", "NVIDIA H200")."""
    import jax

    return jax.default_backend(), jax.devices()[0].device_kind


def start_engine(args: argparse.Namespace):
    """An in-process `LLM` from the parsed engine flags, and its start-up times in seconds.

    In-process (`multiprocess=False`) so the engine core's load and warm-up times can be read.
    """
    from vjx import LLM, EngineArgs

    engine_args = EngineArgs.from_cli_args(args)
    start = time.perf_counter()
    llm = LLM(**{**vars(engine_args), "multiprocess": False})
    engine_ready = time.perf_counter() - start
    core = llm.llm_engine.engine_core.engine_core
    worker = getattr(core.model_executor, "worker", None)
    startup = {
        "load_s": getattr(worker, "load_time", None),
        "warmup_s": core.warmup_time,
        "engine_ready_s": engine_ready,
        "engine_args": {k: str(v) for k, v in engine_arguments(engine_args).items()},
    }
    return llm, startup


def start_engine_run(args: argparse.Namespace, benchmark: str):
    """`start_engine`, and the run's result dict so far: its metadata and start-up times."""
    llm, startup = start_engine(args)
    platform_name, device = jax_device()
    result = run_metadata(benchmark, ENGINE_NAME, platform_name, device, llm.llm_engine.config.model_config.model)
    result.update(startup)
    return llm, result


def check_batch_sizes(batch_sizes: list[int], max_num_seqs: int) -> None:
    """Raises ValueError unless every batch fits one step."""
    for batch_size in batch_sizes:
        if not 1 <= batch_size <= max_num_seqs:
            raise ValueError(f"batch_size must be in [1, max_num_seqs={max_num_seqs}], got {batch_size}.")


def prompt_vocab_size(llm) -> int:
    """Ids drawn below half the vocab stay clear of the special tokens at its top."""
    vocab_size = min(llm.llm_engine.config.model_config.hf_config.vocab_size, len(llm.get_tokenizer()))
    return vocab_size // 2


def random_token_ids(rng: np.random.Generator, vocab_size: int, lengths) -> list[list[int]]:
    """One list of uniformly random token ids per entry of `lengths`."""
    return [rng.integers(0, vocab_size, size=int(n)).tolist() for n in lengths]


def workload_label(result: dict) -> str:
    """A throughput run's requests and lengths, for tables and plots."""
    if result["dataset"] == "sharegpt-synthetic":
        return (
            f"{result['num_prompts']} x sharegpt-synthetic (mean {result['mean_input_len']:.0f} in, "
            f"{result['mean_output_len']:.0f} out)"
        )
    return f"{result['num_prompts']} x ({result['input_len']} in, {result['output_len']} out)"


def startup_rows(result: dict) -> list[tuple[str, str]]:
    rows = []
    if result.get("load_s") is not None:
        rows.append(("load", f"{result['load_s']:.2f} s"))
    if result.get("warmup_s") is not None:
        rows.append(("warm-up (compile)", f"{result['warmup_s']:.2f} s"))
    return rows


def _markdown_row(cells: list[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def print_header(header: list[str]) -> None:
    print(_markdown_row(header))
    print("|" + "---|" * len(header), flush=True)


def print_row(row: list[str]) -> None:
    """Flushed at once, so a long suite shows each result as soon as it is done."""
    print(_markdown_row(row), flush=True)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """One markdown table."""
    print_header(header)
    for row in rows:
        print_row(row)


def write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


def lower_median(values: list, key=None):
    """The middle item of `values` (by `key`), the lower of the two middle ones for an even count:
    always an item that was measured."""
    return sorted(values, key=key)[(len(values) - 1) // 2]


def with_range(median: float, values: list[float], spec: str = ".1f") -> str:
    """A median for a table cell, with the runs' min and max where there were several."""
    if len(values) < 2:
        return f"{median:{spec}}"
    return f"{median:{spec}} ({min(values):{spec}}-{max(values):{spec}})"


def fmt(value, spec: str = ".3f", unit: str = "") -> str:
    """A number for a table cell; '-' where a value is unknown (e.g. no peak for the device)."""
    if value is None:
        return "-"
    return f"{value:{spec}}{unit}"
