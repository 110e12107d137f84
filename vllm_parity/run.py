"""`make test-vllm`: vjx checked against vLLM itself on the embedded default model.

Runs driver.py for vLLM (with vLLM's venv, its CPU settings, one process at a time), then for
vjx (with this project's venv), then compare.py on the two reports. See README.md.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import compare

import examples

HERE = Path(__file__).resolve().parent
VLLM_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    # The KV cache in GiB: small, the machine is shared.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Engine core in this process: one process, and no second copy of the weights.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "PYTHONPATH": str(HERE / "vllm_site"),
}


def run_part(module: str, python: str, model: str, part: list[str], out: Path, log) -> dict:
    env = {**os.environ, **VLLM_ENV} if module == "vllm" else {**os.environ, "PYTHONPATH": str(HERE.parent)}
    start = time.perf_counter()
    command = [python, str(HERE / "driver.py"), "--module", module, "--model", model, "--part", *part]
    proc = subprocess.run([*command, "--out", str(out)], env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"{module} {' '.join(part)}: {time.perf_counter() - start:.0f}s (rc {proc.returncode})", flush=True)
    if proc.returncode != 0:
        sys.exit(f"{module} driver failed on part {part}; see {log.name}")
    return compare.load(out)


def run_side(module: str, python: str, model: str, out_dir: Path) -> Path:
    """Runs every part of one side, each in a process of its own; returns the merged report's
    path. The cases run in as many processes as it takes (a case that breaks the engine ends
    one)."""
    merged = {"cases": {}, "examples": {}}
    with open(out_dir / f"{module}.log", "w") as log:
        merged.update(run_part(module, python, model, ["main"], out_dir / f"{module}_main.json", log))
        start, num_processes, cases_start = 0, 0, time.perf_counter()
        while start is not None:
            report = run_part(
                module, python, model, ["cases", "--start-case", str(start)], out_dir / f"{module}_cases.json", log
            )
            merged["cases"].update(report["cases"])
            start, num_processes = report["resume_at"], num_processes + 1
        merged["timings"].update(cases=round(time.perf_counter() - cases_start, 1), case_processes=num_processes)
        for fn in examples.OWN_ENGINE:
            report = run_part(module, python, model, [fn.__name__], out_dir / f"{module}_{fn.__name__}.json", log)
            merged["examples"].update(report["examples"])
    path = out_dir / f"{module}.json"
    compare.dump(merged, path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-python", required=True, help="python of the venv vllm-cpu is installed in")
    parser.add_argument("--vjx-python", default=sys.executable)
    parser.add_argument("--model", default=None, help="model directory; the embedded default model when unset")
    parser.add_argument("--out-dir", default=str(HERE.parent / ".vllm-parity"))
    parser.add_argument("--reuse-vllm", action="store_true", help="compare with the vLLM report of an earlier run")
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(HERE.parent))
        from vjx.models.default_model import get_default_model_path

        args.model = str(get_default_model_path())
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    vllm_report = out_dir / "vllm.json"
    if not (args.reuse_vllm and vllm_report.exists()):
        vllm_report = run_side("vllm", args.vllm_python, args.model, out_dir)
    vjx_report = run_side("vjx", args.vjx_python, args.model, out_dir)
    status = compare.main(str(vllm_report), str(vjx_report))
    print(f"\ntotal {time.perf_counter() - start:.0f}s; reports in {out_dir}")
    return status


if __name__ == "__main__":
    sys.exit(main())
