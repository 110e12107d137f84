"""INT4 weight-only (W4A16) projection GEMMs at decode and prefill batch sizes: the Pallas kernel
vs jnp dequantizing the weights in the jitted step vs the bf16 product they replace.

    python -m benchmarks.kernels.int4_matmul --model benchmarks/configs/llama-3.1-8b \
        --num-tokens 1 8 64 256 --group-size 128 --output-json int4_matmul.json

Shapes are a decoder layer's fused projections (qkv, gate_up, o, down). Each case jits
`--layers` products with distinct random weights (so nothing is served from the L2 cache,
passed as arguments, never as constants) and reports per layer the mean time of pipelined
calls, and the effective TB/s of each path's weight bytes (INT4: half a byte per weight plus
bf16 scales and uint8 zero points per group). Off GPU the kernel runs in interpret mode (a
smoke run, not a measurement).
"""

import argparse
import sys

import jax
import jax.numpy as jnp

from benchmarks import harness
from benchmarks.kernels.projections import per_layer_us, projection_shapes
from benchmarks.roofline import ModelShape
from vjx.kernels.int4_matmul import int4_matmul, kernel_fits
from vjx.quantization.int4 import dequantized_matmul

HEADER = ["tokens", "projection", "bf16 us", "int4 pallas us", "int4 jnp us", "bf16 TB/s", "int4 pallas TB/s"]


def _int4_weights(key, num_in: int, num_out: int, group_size: int):
    groups = num_in // group_size
    packed = jax.random.randint(key, (num_in // 2, num_out), 0, 256, jnp.int32).astype(jnp.uint8)
    scale = jax.random.uniform(jax.random.fold_in(key, 1), (groups, num_out), jnp.bfloat16, 0.005, 0.02)
    zero = jax.random.randint(jax.random.fold_in(key, 2), (groups, num_out), 0, 16, jnp.int32).astype(jnp.uint8)
    return packed, scale, zero


def _time_us(product, x, weights, layers: int) -> float:
    return per_layer_us(lambda x, weights: [product(x, *w) for w in weights], x, weights, layers)


def time_case(num_tokens: int, num_in: int, num_out: int, group_size: int, layers: int, key) -> dict[str, float]:
    """Per-layer us of the three paths for one [num_in, num_out] projection."""
    x = jax.random.normal(jax.random.fold_in(key, 7), (num_tokens, num_in), jnp.bfloat16)
    dense = [
        (jax.random.normal(jax.random.fold_in(key, layer), (num_in, num_out), jnp.bfloat16) * 0.02,)
        for layer in range(layers)
    ]
    quantized = [
        _int4_weights(jax.random.fold_in(key, 100 + layer), num_in, num_out, group_size) for layer in range(layers)
    ]
    interpret = jax.default_backend() != "gpu"
    return {
        "bf16_us": _time_us(lambda x, w: x @ w, x, dense, layers),
        "int4_pallas_us": _time_us(
            lambda x, p, s, z: int4_matmul(x, p, s, z, group_size=group_size, interpret=interpret), x, quantized, layers
        ),
        "int4_jnp_us": _time_us(dequantized_matmul, x, quantized, layers),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A directory with the HF config.json.")
    parser.add_argument("--num-tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    if args.layers < 1 or min(args.num_tokens) < 1:
        raise ValueError(f"layers and num_tokens must be >= 1, got {args.layers} and {args.num_tokens}.")
    shape = ModelShape.from_model_dir(args.model, "bfloat16")
    platform_name, device = harness.jax_device()
    result = harness.run_metadata("int4_matmul", harness.ENGINE_NAME, platform_name, device, args.model)
    result.update({"layers": args.layers, "group_size": args.group_size, "runs": []})
    key = jax.random.key(0)
    harness.print_header(HEADER)
    for num_tokens in args.num_tokens:
        for name, (_, ((num_in, num_out),)) in projection_shapes(shape).items():
            if not kernel_fits(num_in, num_out, args.group_size):
                raise ValueError(f"{name} [{num_in}, {num_out}] does not fit the kernel's tiles.")
            times = time_case(num_tokens, num_in, num_out, args.group_size, args.layers, key)
            bf16_bytes = 2 * num_in * num_out
            int4_bytes = num_in * num_out // 2 + 3 * (num_in // args.group_size) * num_out
            run = {"num_tokens": num_tokens, "projection": name, "bf16_bytes": bf16_bytes, "int4_bytes": int4_bytes}
            result["runs"].append({**run, **times})
            harness.print_row(
                [
                    str(num_tokens),
                    name,
                    *(f"{times[k]:.1f}" for k in ("bf16_us", "int4_pallas_us", "int4_jnp_us")),
                    f"{bf16_bytes / times['bf16_us'] / 1e6:.2f}",
                    f"{int4_bytes / times['int4_pallas_us'] / 1e6:.2f}",
                ]
            )
            harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
