"""A decoder layer's projection GEMMs through XLA at decode batch sizes: q, k, v and gate, up
as separate weights against vLLM's fused `qkv_proj` and `gate_up_proj` (what vjx's Llama uses).

    python -m benchmarks.kernels.projections --model benchmarks/configs/llama-3.1-8b \
        --num-tokens 1 8 64 256 --output-json projections.json

Each case jits `--layers` products with distinct weights (random normal bf16, like a model's
layers, so nothing is served from the L2 cache; passed as arguments, never as constants) and
reports per layer the mean time of pipelined calls (dispatch hidden behind the device), and
the effective TB/s of the weight bytes. `o` and
`down` have no fused form: their two columns time the same product twice (the run's spread).
"""

import argparse
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks import harness
from benchmarks.roofline import ModelShape

_CALLS = 30
HEADER = ["tokens", "projection", "separate us", "fused us", "separate TB/s", "fused TB/s"]


def projection_shapes(shape: ModelShape) -> dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """{projection: ([(in, out)] of the separate weights, [(in, out)] of the fused one)}."""
    hidden, mlp = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {
        "qkv": ([(hidden, q), (hidden, kv), (hidden, kv)], [(hidden, q + 2 * kv)]),
        "gate_up": ([(hidden, mlp), (hidden, mlp)], [(hidden, 2 * mlp)]),
        "o": ([(q, hidden)], [(q, hidden)]),
        "down": ([(mlp, hidden)], [(mlp, hidden)]),
    }


def time_per_layer_us(num_tokens: int, shapes: list[tuple[int, int]], layers: int, key) -> float:
    """One jitted call of `layers` layers' products of these shapes; us per layer."""
    weights = [
        [
            jax.random.normal(jax.random.fold_in(key, 1000 * i + layer), shape, jnp.bfloat16) * 0.02
            for layer in range(layers)
        ]
        for i, shape in enumerate(shapes)
    ]
    x = jax.random.normal(jax.random.fold_in(key, 7), (num_tokens, shapes[0][0]), jnp.bfloat16)
    return per_layer_us(lambda x, weights: [x @ w for per_shape in weights for w in per_shape], x, weights, layers)


def per_layer_us(products, x, weights, layers: int) -> float:
    """`products(x, weights)` jitted, after a warm-up call: the mean of pipelined calls, per layer."""
    step = jax.jit(products)
    jax.block_until_ready(step(x, weights))
    start = time.perf_counter()
    for _ in range(_CALLS):
        out = step(x, weights)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / _CALLS / layers * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A directory with the HF config.json.")
    parser.add_argument("--num-tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    if args.layers < 1 or min(args.num_tokens) < 1:
        raise ValueError(f"layers and num_tokens must be >= 1, got {args.layers} and {args.num_tokens}.")
    shape = ModelShape.from_model_dir(args.model, "bfloat16")
    platform_name, device = harness.jax_device()
    result = harness.run_metadata("projections", harness.ENGINE_NAME, platform_name, device, args.model)
    result.update({"layers": args.layers, "runs": []})
    key = jax.random.key(0)
    harness.print_header(HEADER)
    for num_tokens in args.num_tokens:
        for name, (separate, fused) in projection_shapes(shape).items():
            weight_bytes = 2 * sum(i * o for i, o in fused)
            times = {
                kind: time_per_layer_us(num_tokens, shapes, args.layers, key)
                for kind, shapes in (("separate", separate), ("fused", fused))
            }
            run = {
                "num_tokens": num_tokens,
                "projection": name,
                "weight_bytes": weight_bytes,
                **{f"{kind}_us": us for kind, us in times.items()},
            }
            result["runs"].append(run)
            tbps = [weight_bytes / (times[kind] * 1e-6) / 1e12 for kind in ("separate", "fused")]
            harness.print_row(
                [
                    str(num_tokens),
                    name,
                    f"{times['separate']:.1f}",
                    f"{times['fused']:.1f}",
                    f"{tbps[0]:.2f}",
                    f"{tbps[1]:.2f}",
                ]
            )
            harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
