"""Pipeline parallelism's bubble: PP 2 against PP 1 at equal work per device.

PP 1 runs a model of `--num-layers` layers on one device; PP 2 runs it with twice the layers
on two devices, a stage each, so every device runs `--num-layers` layers a step and a
pipeline without a bubble keeps PP 1's time. For each layout, in an engine of its own, the
time of `--num-prompts` requests (`--input-len` random tokens in, `--output-len` out,
ignore_eos, greedy), and of one request alone (its steps have nothing to overlap with: the
stages take turns). PP 2 splits the requests into two micro-batches (`max_num_seqs` is half),
one per step in flight, as vLLM's batch queue does. bubble = 1 - time(PP 1) / time(PP 2): 0
when the stages work at once, 0.5 when they take turns.

    python -m benchmarks.pipeline --model benchmarks/configs/llama-3.1-8b --hidden-size 1024 \
        --vocab-size 1024 --num-layers 4 --output-json benchmarks/results/pp_bubble.json

`--hidden-size` (and the MLP width with it) and `--vocab-size` shrink the config's model for
a CPU run (a small vocabulary keeps the LM head, which only the last stage runs, from
outweighing the layers); the
weights are random (load_format dummy), the tokenizer the embedded default model's. On CPU
the devices are XLA's host devices (`--xla_force_host_platform_device_count`), which share
the machine's cores.
"""

import argparse
import gc
import json
import pathlib
import tempfile
import time

import numpy as np

from benchmarks import harness
from vjx import LLM, SamplingParams
from vjx.models.default_model import get_default_model_path


def _config_dir(args: argparse.Namespace, num_layers: int, directory: pathlib.Path) -> str:
    config = json.loads((pathlib.Path(args.model) / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    if args.hidden_size is not None:
        scale = args.hidden_size / config["hidden_size"]
        config["hidden_size"] = args.hidden_size
        config["intermediate_size"] = max(int(config["intermediate_size"] * scale) // 8 * 8, 8)
        config["head_dim"] = max(args.hidden_size // config["num_attention_heads"], 8)
    if args.vocab_size is not None:
        config["vocab_size"] = args.vocab_size
    path = directory / f"layers{num_layers}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _time(llm: LLM, prompts: list[dict], params: SamplingParams) -> float:
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def run_layout(args: argparse.Namespace, pipeline_parallel_size: int, directory: pathlib.Path) -> dict:
    model = _config_dir(args, args.num_layers * pipeline_parallel_size, directory)
    llm = LLM(
        model,
        tokenizer=args.tokenizer or get_default_model_path(),
        load_format="dummy",
        dtype=args.dtype,
        pipeline_parallel_size=pipeline_parallel_size,
        max_model_len=args.input_len + args.output_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        # Micro-batches: each step in flight holds its share of the requests.
        max_num_seqs=max(args.num_prompts // pipeline_parallel_size, 1),
        async_scheduling=False,
    )
    rng = np.random.default_rng(0)
    prompts = [
        {"prompt_token_ids": ids} for ids in harness.random_token_ids(rng, 1000, [args.input_len] * args.num_prompts)
    ]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    result = {
        "pipeline_parallel_size": pipeline_parallel_size,
        "num_layers": args.num_layers * pipeline_parallel_size,
        "batch_s": _time(llm, prompts, params),
        "one_request_s": _time(llm, prompts[:1], params),
    }
    del llm
    gc.collect()
    return result


def summarize(runs: list[dict]) -> dict:
    pp1, pp2 = runs
    return {
        "bubble": 1 - pp1["batch_s"] / pp2["batch_s"],
        "bubble_one_request": 1 - pp1["one_request_s"] / pp2["one_request_s"],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A directory with a config.json (benchmarks/configs/...).")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--hidden-size", type=int, default=None, help="Shrink the model to this hidden size.")
    parser.add_argument(
        "--vocab-size", type=int, default=None, help="Shrink the vocabulary (the LM head runs on the last stage only)."
    )
    parser.add_argument("--num-layers", type=int, default=4, help="Layers per device (PP 2 runs twice as many).")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--output-json", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    platform_name, device = harness.jax_device()
    with tempfile.TemporaryDirectory() as directory:
        runs = [run_layout(args, pp, pathlib.Path(directory)) for pp in (1, 2)]
    result = {**harness.run_metadata("pipeline_bubble", "vjx", platform_name, device, args.model), "args": vars(args)}
    result.update(runs=runs, **summarize(runs))
    rows = [
        [
            str(run["pipeline_parallel_size"]),
            str(run["num_layers"]),
            harness.fmt(run["batch_s"]),
            harness.fmt(run["one_request_s"]),
        ]
        for run in runs
    ]
    harness.print_table(["PP", "layers", f"{args.num_prompts} requests (s)", "1 request (s)"], rows)
    print(
        f"bubble: {result['bubble']:.3f} ({args.num_prompts} requests), {result['bubble_one_request']:.3f} (1 request)"
    )
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
