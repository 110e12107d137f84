"""One MoE layer's experts at a model's shapes: vjx's fused experts against a dense loop over
the experts and against the dense GEMMs of the same active width.

    python -m benchmarks.moe --model benchmarks/configs/qwen3-30b-a3b \
        --num-tokens 1 16 256 --output-json moe.json [--num-experts 32] [--dtype float32]

Shapes come from the config (hidden size; `moe_intermediate_size`, else `intermediate_size`,
as each expert's width F; `num_experts` E; `num_experts_per_tok` K; `--num-experts` overrides E
for a small machine). Three ways to compute the experts of T tokens, each jitted with the
weights as arguments (random normal, never constants), best of `--repeats` means of pipelined
calls:
- `fused`: vjx's `fused_experts`: with more (token, expert) pairs than experts the pairs
  sorted by expert and two `jax.lax.ragged_dot` calls (path "grouped"), else each pair's
  expert weights gathered (path "gathered");
- `loop`: a static-shape loop over the experts, each one's MLP on all T tokens, weighted by
  its routing weight (zero for the tokens it does not serve): E times the needed FLOPs, what a
  layer without grouped GEMMs pays under `jit`;
- `active dense`: one gated MLP of width K * F on the T tokens, the FLOPs the routed tokens
  need in dense form: the bound a grouped GEMM approaches when every expert gets tokens.

The engine runs of whole MoE models use the other benchmarks with dummy weights, e.g.
`python -m benchmarks.throughput --model benchmarks/configs/qwen3-30b-a3b --load-format dummy
--tokenizer DIR` (see benchmarks/README.md).
"""

import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks import harness
from vjx.models.layers.activation import GATED_ACTIVATIONS
from vjx.models.layers.fused_moe import fused_experts, select_experts

HEADER = ["tokens", "experts", "top-k", "path", "fused us", "loop us", "active dense us", "loop / fused"]
_CALLS = 10


def moe_shape(config: dict, num_experts: int | None) -> dict[str, int]:
    """{hidden, width, num_experts, top_k} of the config's MoE layers."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    if not experts:
        raise ValueError("the config has no num_experts / num_local_experts: not a MoE model.")
    return {
        "hidden": config["hidden_size"],
        "width": config.get("moe_intermediate_size") or config["intermediate_size"],
        "num_experts": num_experts or experts,
        "top_k": config["num_experts_per_tok"],
    }


def _loop(x_TD, weights_TK, ids_TK, w13, w2):
    out_TD = jnp.zeros_like(x_TD)
    for e in range(w13.shape[0]):
        weight_T = jnp.sum(jnp.where(ids_TK == e, weights_TK, 0.0), axis=-1).astype(x_TD.dtype)
        gate_up_T2F = jnp.einsum("TD,DGF->TGF", x_TD, w13[e])
        h_TF = GATED_ACTIVATIONS["silu"](gate_up_T2F[:, 0], gate_up_T2F[:, 1])
        out_TD = out_TD + weight_T[:, None] * (h_TF @ w2[e])
    return out_TD


def _active_dense(x_TD, w13_D2W, w2_WD):
    gate_up_T2W = jnp.einsum("TD,DGW->TGW", x_TD, w13_D2W)
    return GATED_ACTIVATIONS["silu"](gate_up_T2W[:, 0], gate_up_T2W[:, 1]) @ w2_WD


def _time_us(fn, args, repeats: int) -> float:
    step = jax.jit(fn)
    jax.block_until_ready(step(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(_CALLS):
            out = step(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / _CALLS)
    return best * 1e6


def time_case(num_tokens: int, shape: dict[str, int], dtype, repeats: int, key) -> dict:
    E, D, F, K = shape["num_experts"], shape["hidden"], shape["width"], shape["top_k"]
    keys = jax.random.split(key, 6)
    x = jax.random.normal(keys[0], (num_tokens, D), dtype)
    w13 = jax.random.normal(keys[1], (E, D, 2, F), dtype) * 0.02
    w2 = jax.random.normal(keys[2], (E, F, D), dtype) * 0.02
    weights, ids = select_experts(jax.random.normal(keys[3], (num_tokens, E)), K, renormalize=True)
    fused = _time_us(lambda *a: fused_experts(*a, activation="silu"), (x, weights, ids, w13, w2), repeats)
    loop = _time_us(_loop, (x, weights, ids, w13, w2), repeats)
    w13_dense = jax.random.normal(keys[4], (D, 2, K * F), dtype) * 0.02
    w2_dense = jax.random.normal(keys[5], (K * F, D), dtype) * 0.02
    dense = _time_us(_active_dense, (x, w13_dense, w2_dense), repeats)
    path = "gathered" if num_tokens * K <= E else "grouped"
    return {"path": path, "fused_us": fused, "loop_us": loop, "active_dense_us": dense}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A directory with the HF config.json.")
    parser.add_argument("--num-tokens", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--num-experts", type=int, default=None, help="Overrides the config's expert count.")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    if min(args.num_tokens) < 1 or args.repeats < 1 or (args.num_experts is not None and args.num_experts < 1):
        raise ValueError(
            f"num_tokens, repeats and num_experts must be >= 1, got {args.num_tokens}, {args.repeats}, "
            f"{args.num_experts}."
        )
    config = json.loads((pathlib.Path(args.model) / "config.json").read_text())
    shape = moe_shape(config, args.num_experts)
    if shape["top_k"] > shape["num_experts"]:
        raise ValueError(f"num_experts must be >= the config's top_k {shape['top_k']}, got {shape['num_experts']}.")
    platform_name, device = harness.jax_device()
    result = harness.run_metadata("moe", harness.ENGINE_NAME, platform_name, device, args.model)
    result.update({**shape, "dtype": args.dtype, "repeats": args.repeats, "runs": []})
    harness.print_header(HEADER)
    for num_tokens in args.num_tokens:
        times = time_case(num_tokens, shape, jnp.dtype(args.dtype), args.repeats, jax.random.key(num_tokens))
        result["runs"].append({"num_tokens": num_tokens, **times})
        harness.print_row(
            [
                str(num_tokens),
                str(shape["num_experts"]),
                str(shape["top_k"]),
                times["path"],
                f"{times['fused_us']:.0f}",
                f"{times['loop_us']:.0f}",
                f"{times['active_dense_us']:.0f}",
                f"{times['loop_us'] / times['fused_us']:.2f}",
            ]
        )
        harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
