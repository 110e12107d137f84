r"""Quantized vs unquantized weights: per format, the linear weights' device bytes, one
projection's GEMM time and the decode step time at each batch size.

    python -m benchmarks.quantization [--formats none fp8 awq ... --batch-sizes 1 64 --output-len 32] \
        [--group-size 64] [--output-json quantization.json] [engine args...]

Each format starts its own engine on the same model: "none" keeps the checkpoint's dtype,
"fp8" and "ptpc_fp8" quantize it at load (`quantization=`), and the checkpoint formats of
benchmarks/quantized_checkpoints.py (awq, gptq, ct_int8, fp8_block, ...) load a copy of the
checkpoint written in that format first (round-to-nearest, `--group-size` groups and blocks:
it must divide the hidden and MLP sizes; SmolLM2-135M's 576 takes 64, not 128). The GEMM is
the first layer's down projection (the model's real [intermediate, hidden] shape) run alone,
jitted, at batch-size tokens; best of `--repeats` x 20 calls. The decode step time is a batch's
generate time (random prompts of `--input-len` ids, every request running exactly
`--output-len` tokens) over its output length; best of `--repeats` after a warm-up run.
"""

import argparse
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import harness
from vjx import EngineArgs, SamplingParams
from vjx.models.layers.linear import Linear
from vjx.quantization import ONLINE_METHODS

HEADER = ["format", "linear weight MB", "batch", "down_proj GEMM us", "decode step ms", "output tok/s"]
_GEMM_CALLS = 20


def _model(llm) -> nnx.Module:
    return llm.llm_engine.engine_core.engine_core.model_executor.worker.model


def _linear_bytes(model: nnx.Module) -> int:
    """Device bytes of every linear layer's params (kernels, scales, biases)."""
    total = 0
    for _, node in nnx.iter_graph(model):
        if isinstance(node, Linear):
            total += sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(node)))
    return total


def _gemm_us(layer: Linear, num_tokens: int, repeats: int, dtype: str) -> float:
    x = jax.random.normal(jax.random.key(0), (num_tokens, *layer.in_shape), jnp.dtype(dtype))
    graphdef, state = nnx.split(layer)
    apply = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
    apply(state, x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(_GEMM_CALLS):
            y = apply(state, x)
        y.block_until_ready()
        best = min(best, (time.perf_counter() - start) / _GEMM_CALLS)
    return best * 1e6


def _step_ms(llm, prompts: list[list[int]], params: SamplingParams, repeats: int) -> float:
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    llm.generate(requests, params, use_tqdm=False)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(requests, params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return best / params.max_tokens * 1e3


def _format_args(args: argparse.Namespace, fmt: str, directory: str) -> argparse.Namespace:
    """The engine args of format `fmt`; a checkpoint format's copy is written to `directory`."""
    if fmt in ("none", *ONLINE_METHODS):
        return argparse.Namespace(**{**vars(args), "quantization": None if fmt == "none" else fmt})
    import torch
    import transformers

    from benchmarks.quantized_checkpoints import write_checkpoint

    source = EngineArgs(model=args.model)._resolve_model()
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    write_checkpoint(fmt, hf_model, directory, None, args.group_size)
    return argparse.Namespace(**{**vars(args), "model": directory, "tokenizer": args.tokenizer or source})


def run(args: argparse.Namespace) -> dict:
    rows, result = [], None
    for fmt in args.formats:
        with tempfile.TemporaryDirectory() as directory:
            llm, fmt_result = harness.start_engine_run(_format_args(args, fmt, directory), "quantization")
            result = result or fmt_result
            harness.check_batch_sizes(args.batch_sizes, llm.llm_engine.config.scheduler_config.max_num_seqs)
            model, dtype = _model(llm), llm.llm_engine.config.model_config.dtype
            down_proj = model.model.layers[0].mlp.down_proj
            rng = np.random.default_rng(args.seed)
            params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
            for batch_size in args.batch_sizes:
                prompts = harness.random_token_ids(rng, harness.prompt_vocab_size(llm), [args.input_len] * batch_size)
                step_ms = _step_ms(llm, prompts, params, args.repeats)
                rows.append(
                    {
                        "format": fmt,
                        "linear_weight_bytes": _linear_bytes(model),
                        "batch_size": batch_size,
                        "down_proj_gemm_us": _gemm_us(down_proj, batch_size, args.repeats, dtype),
                        "decode_step_ms": step_ms,
                        "output_tokens_per_s": batch_size * 1e3 / step_ms,
                    }
                )
            llm.shutdown()
            del llm, model, down_proj
    result.update(input_len=args.input_len, output_len=args.output_len, repeats=args.repeats, rows=rows)
    return result


def table_row(row: dict) -> list[str]:
    return [
        row["format"],
        harness.fmt(row["linear_weight_bytes"] / 1e6, ".1f"),
        str(row["batch_size"]),
        harness.fmt(row["down_proj_gemm_us"], ".0f"),
        harness.fmt(row["decode_step_ms"], ".1f"),
        harness.fmt(row["output_tokens_per_s"], ".1f"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--formats", nargs="+", default=["none", "fp8"])
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    result = run(args)
    harness.print_table(HEADER, [table_row(row) for row in result["rows"]])
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
