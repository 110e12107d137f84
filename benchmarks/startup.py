r"""Start-up: how long an engine takes to be ready, from safetensors on disk, with a cold and a
warm compilation cache.

    python -m benchmarks.startup --model benchmarks/configs/llama-3.1-8b --tokenizer .carry/smollm2 \
        --dtype bfloat16 --max-model-len 2048 --weights-dir /tmp/llama-8b --repeats 3 \
        [--output-json startup.json]

First, random weights of the config's shapes (normal, std 0.02, the model dtype; never zeros)
are written as sharded safetensors, with the config and the tokenizer, to `--weights-dir`
(kept when it holds them already, so later calls skip the writing). Then each run starts a
fresh Python process that builds `LLM(weights_dir, ...)` and generates one token: a cold run
with an empty compilation cache directory of its own, then a warm run with the cache the cold
run filled. Each run reports the process's wall time to the first token and the engine's own
phases (weight load, warm-up compile, construction). `--repeats` pairs; the table gives the
median with min and max.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import harness
from vjx import EngineArgs

SHARD_BYTES = 2 * 1024**3
HEADER = ["run", "ready s (median)", "min", "max", "load s", "warm-up s", "construction s"]
PHASES = ("ready_s", "load_s", "warmup_s", "construct_s")


def write_random_checkpoint(config_dir: str, weights_dir: pathlib.Path, dtype: str, tokenizer: str | None) -> int:
    """Random safetensors shards of the model in `config_dir` (transformers names and shapes),
    its config and the tokenizer files; returns the bytes written (0 when already there)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    if (weights_dir / "model.safetensors.index.json").exists():
        return 0
    config = transformers.AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in transformers.AutoModelForCausalLM.from_config(config).state_dict().items()}
    torch_dtype = getattr(torch, dtype)
    weights_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    shard, shard_bytes, weight_map, total = {}, 0, {}, 0

    def flush():
        nonlocal shard, shard_bytes
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(weights_dir / name), metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in shard})
        shard, shard_bytes = {}, 0

    for name, shape in shapes.items():
        if "norm" in name:
            tensor = torch.ones(shape, dtype=torch_dtype)
        else:
            tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch_dtype)
        shard[name] = tensor
        shard_bytes += tensor.numel() * tensor.element_size()
        total += tensor.numel() * tensor.element_size()
        if shard_bytes >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (weights_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    config.save_pretrained(weights_dir)
    try:
        transformers.AutoTokenizer.from_pretrained(tokenizer or config_dir).save_pretrained(weights_dir)
    except (OSError, ValueError) as e:
        raise ValueError(f"no tokenizer in {config_dir}: pass --tokenizer ({e}).") from None
    return total


def run_once(engine_argv: list[str], cache_dir: str) -> dict:
    """One fresh process: `LLM(...)` then one generated token, its phases in seconds."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache_dir}
    start = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.startup", "--child", *engine_argv], env=env, capture_output=True, text=True
    )
    ready = time.perf_counter() - start
    if child.returncode != 0:
        raise RuntimeError(f"the start-up run failed:\n{child.stderr[-3000:]}")
    phases = json.loads(child.stdout.strip().splitlines()[-1])
    return {"ready_s": ready, **phases}


def _child(engine_argv: list[str]) -> None:
    from vjx import SamplingParams

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    llm, startup = harness.start_engine(parser.parse_args(engine_argv))
    llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=1), use_tqdm=False)
    phases = {"load_s": startup["load_s"], "warmup_s": startup["warmup_s"], "construct_s": startup["engine_ready_s"]}
    print(json.dumps(phases))


def _summary(runs: list[dict]) -> dict:
    return {
        phase: {
            "median": statistics.median(r[phase] for r in runs),
            "min": min(r[phase] for r in runs),
            "max": max(r[phase] for r in runs),
        }
        for phase in PHASES
    }


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights-dir", required=True, help="Where the random checkpoint is (or will be) written.")
    parser.add_argument("--repeats", type=int, default=3, help="Cold and warm runs, each.")
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {args.repeats}.")
    return args, list(argv)


def _engine_argv(argv: list[str], weights_dir: str) -> list[str]:
    """The engine flags of `argv` with the model replaced by the written checkpoint."""
    out, skip = [], False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        if token in ("--weights-dir", "--repeats", "--output-json", "--model", "--tokenizer", "--load-format"):
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(token)
    return ["--model", weights_dir, *out]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1:])
        return 0
    args, raw = _parse(argv)
    weights_dir = pathlib.Path(args.weights_dir)
    config_dir = args.model or _default_model()
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype
    written = write_random_checkpoint(config_dir, weights_dir, dtype, args.tokenizer)
    engine_argv = _engine_argv(raw, str(weights_dir))
    cold, warm = [], []
    for _ in range(args.repeats):
        cache_dir = tempfile.mkdtemp(prefix="vjx-startup-cache-")
        try:
            cold.append(run_once(engine_argv, cache_dir))
            warm.append(run_once(engine_argv, cache_dir))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    platform_name, device = harness.jax_device()
    result = harness.run_metadata("startup", harness.ENGINE_NAME, platform_name, device, config_dir)
    result.update(bytes_written=written, checkpoint_bytes=_checkpoint_bytes(weights_dir), cold=cold, warm=warm)
    result["summary"] = {"cold": _summary(cold), "warm": _summary(warm)}
    rows = []
    for name in ("cold", "warm"):
        s = result["summary"][name]
        ready = s["ready_s"]
        rows.append(
            [name, f"{ready['median']:.1f}", f"{ready['min']:.1f}", f"{ready['max']:.1f}"]
            + [f"{s[p]['median']:.1f}" for p in ("load_s", "warmup_s", "construct_s")]
        )
    print(f"start-up: {config_dir} from {weights_dir} ({result['checkpoint_bytes'] / 1e9:.1f} GB), {args.repeats} runs")
    harness.print_table(HEADER, rows)
    harness.write_json(args.output_json, result)
    return 0


def _default_model() -> str:
    from vjx.models.default_model import get_default_model_path

    return get_default_model_path()


def _checkpoint_bytes(weights_dir: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in weights_dir.glob("*.safetensors"))


if __name__ == "__main__":
    sys.exit(main())
