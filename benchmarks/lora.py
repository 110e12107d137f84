"""The cost of LoRA adapters in a batch: step times with 0, 1 and N distinct adapters.

    python -m benchmarks.lora --model DIR [--load-format dummy --tokenizer DIR] --enable-lora \
        --max-loras 4 --max-lora-rank 16 --num-adapters 0 1 4 --batch-size 8 --input-len 64 \
        --output-len 32 --output-json lora.json

Writes max(--num-adapters) random PEFT adapters for the model (rank --lora-rank on all seven
projections, A and B drawn from a seeded normal) into a temporary directory. For each count c,
a batch of --batch-size requests of random tokens, request i on adapter i % c (the base model
for c = 0), greedy with ignore_eos: the mean of --num-iters timed `generate` calls after
--num-iters-warmup, for --output-len tokens and for one token (the prefill). The decode step
is (full - prefill) / (output_len - 1). With c = 0 the engine still has its LoRA slots (every
token on slot -1), so the rows compare the adapters' own cost.
"""

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import save_file

from benchmarks import harness
from vjx import EngineArgs, SamplingParams
from vjx.lora.request import LoRARequest

HEADER = ["adapters", "batch", "in", "out", "prefill ms", "request ms", "decode step ms"]
_MODULES = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each LoRA target of the model's decoder layers."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = (config.get("num_key_value_heads") or heads) * head_dim
    mlp = config["intermediate_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, mlp),
        "up_proj": (hidden, mlp),
        "down_proj": (mlp, hidden),
    }


def write_adapter(path: pathlib.Path, config: dict, rank: int, seed: int) -> None:
    """A PEFT adapter directory of random weights for every projection of every layer."""
    rng = np.random.default_rng(seed)
    shapes, tensors = projection_shapes(config), {}
    for layer in range(config["num_hidden_layers"]):
        for block, modules in _MODULES.items():
            for module in modules:
                fan_in, fan_out = shapes[module]
                prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
                tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / fan_in**0.5).astype(
                    np.float32
                )
                tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) / rank**0.5).astype(
                    np.float32
                )
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    targets = [module for modules in _MODULES.values() for module in modules]
    adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets, "bias": "none"}
    (path / "adapter_config.json").write_text(json.dumps(adapter_config))


def time_generate(llm, prompts, params, loras, args) -> float:
    """Mean seconds of one `generate` of the batch, after the warm-ups."""
    for _ in range(args.num_iters_warmup):
        llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    start = time.perf_counter()
    for _ in range(args.num_iters):
        llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    return (time.perf_counter() - start) / args.num_iters


def run_count(llm, adapters: list[LoRARequest], num_adapters: int, args, rng) -> dict:
    vocab = harness.prompt_vocab_size(llm)
    prompts = [
        {"prompt_token_ids": ids} for ids in harness.random_token_ids(rng, vocab, [args.input_len] * args.batch_size)
    ]
    loras = [adapters[i % num_adapters] if num_adapters else None for i in range(args.batch_size)]
    full = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    prefill = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    request_s = time_generate(llm, prompts, full, loras, args)
    prefill_s = time_generate(llm, prompts, prefill, loras, args)
    step_s = (request_s - prefill_s) / (args.output_len - 1)
    return {"num_adapters": num_adapters, "prefill_s": prefill_s, "request_s": request_s, "decode_step_s": step_s}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-adapters", type=int, nargs="+", default=[0, 1, 4])
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-iters-warmup", type=int, default=1)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if not args.enable_lora or min(args.num_adapters) < 0 or max(args.num_adapters) > args.max_loras:
        raise ValueError(
            f"benchmarks.lora needs --enable-lora and --num-adapters in [0, max_loras={args.max_loras}], got "
            f"enable_lora={args.enable_lora}, num_adapters={args.num_adapters}."
        )
    if min(args.lora_rank, args.batch_size, args.input_len, args.num_iters) < 1 or args.output_len < 2:
        raise ValueError("lora_rank, batch_size, input_len and num_iters must be >= 1 and output_len >= 2.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = json.loads((pathlib.Path(args.model) / "config.json").read_text())
    llm, result = harness.start_engine_run(args, "lora")
    result.update({"lora_rank": args.lora_rank, "batch_size": args.batch_size, "runs": []})
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as root:
        adapters = []
        for i in range(max(args.num_adapters)):
            write_adapter(pathlib.Path(root) / f"adapter{i}", config, args.lora_rank, seed=i)
            adapters.append(LoRARequest(f"adapter{i}", i + 1, f"{root}/adapter{i}"))
        harness.print_header(HEADER)
        for num_adapters in args.num_adapters:
            run = run_count(llm, adapters, num_adapters, args, rng)
            result["runs"].append(run)
            harness.print_row(
                [str(num_adapters), str(args.batch_size), str(args.input_len), str(args.output_len)]
                + [f"{run[k] * 1e3:.1f}" for k in ("prefill_s", "request_s", "decode_step_s")]
            )
            harness.write_json(args.output_json, result)
    llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
