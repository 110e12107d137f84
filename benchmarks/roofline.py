r"""Roofline: the bytes a step must move and the FLOPs it must do, and the fraction of the
device's peak a measured time reaches.

    python -m benchmarks.roofline --model benchmarks/configs/llama-3.1-8b --batch-size 8 \
        --input-len 32 --output-len 128 [--dtype bfloat16] [--device-kind "NVIDIA H200"] \
        [--latency-json results/latency.json]

Model (a dense Llama-family decoder; legend of DESIGN.md: L layers, D hidden, N query heads,
K kv heads, H head dim, F MLP width, V vocab, b bytes per element):
- params: V*D embedding (+ V*D LM head unless tied) + L * (D*N*H + 2*D*K*H + N*H*D + 3*D*F
  + 2*D norms) + D final norm.
- a step runs requests, each `q` new tokens with `s` keys after the step (s includes them);
  T = sum q tokens, R requests, one sampled row per request.
- bytes: every weight once, except the embedding table, of which only T rows are gathered
  (a tied table is read whole by the LM head); KV read s tokens per request and written for
  T tokens, 2*K*H*b per token per layer. Activations are not counted (small at these sizes).
- FLOPs: 2 per multiply-add. Linear layers 2*T*L*(D*N*H + 2*D*K*H + N*H*D + 3*D*F); LM head
  2*R*D*V; attention 4*N*H per (query, key) pair per layer, causal: query i of q sees
  s - q + i + 1 keys. Norms, RoPE, softmax and sampling are not counted.

A decode step is bandwidth-bound: its fraction is bytes / time / peak HBM bandwidth. A prefill
is compute-bound: FLOPs / time / peak dense tensor-core throughput. A floor is the larger of
bytes / bandwidth and FLOPs / throughput.
"""

import argparse
import json
import sys

from benchmarks.harness import fmt, print_table
from vjx.metrics.roofline import (  # noqa: F401 - the benchmarks' names for them
    DEVICE_PEAKS,
    DTYPE_BYTES,
    DevicePeak,
    ModelShape,
    dtype_bytes,
    step_bytes,
    step_flops,
)


def request_flops(shape: ModelShape, input_len: int, output_len: int) -> int:
    """FLOPs of one whole request: its prefill and its output_len - 1 decode steps, which
    together run n = input_len + output_len - 1 tokens with n * (n + 1) / 2 causal pairs and
    sample output_len rows."""
    num_tokens = input_len + output_len - 1
    linear = 2 * num_tokens * shape.num_layers * shape.layer_linear_params
    lm_head = 2 * output_len * shape.hidden_size * shape.vocab_size
    pairs = num_tokens * (num_tokens + 1) // 2
    return linear + lm_head + 4 * shape.num_heads * shape.head_dim * shape.num_layers * pairs


def floor_s(shape: ModelShape, requests: list[tuple[int, int]], peak: DevicePeak) -> float:
    return max(
        step_bytes(shape, requests) / peak.hbm_bytes_per_s, step_flops(shape, requests) / peak.dense_bf16_flops_per_s
    )


def batch_latency_floor_s(
    shape: ModelShape, batch_size: int, input_len: int, output_len: int, peak: DevicePeak
) -> float:
    """The fastest a batch can finish: one prefill step, then output_len - 1 decode steps."""
    total = floor_s(shape, [(input_len, input_len)] * batch_size, peak)
    for seq_len in range(input_len + 1, input_len + output_len):
        total += floor_s(shape, [(1, seq_len)] * batch_size, peak)
    return total


def mean_decode_requests(batch_size: int, input_len: int, output_len: int) -> list[tuple[int, float]]:
    """A decode step at the mean context of a batch's output_len - 1 decode steps (bytes and
    FLOPs are linear in s, so this step's cost is the mean step's cost)."""
    mean_seq_len = input_len + output_len / 2
    return [(1, mean_seq_len)] * batch_size


def latency_roofline(shape: ModelShape, peak: DevicePeak | None, workload: tuple[int, int, int], times: dict) -> dict:
    """Roofline fields of a latency run. `workload` is (batch, input_len, output_len);
    `times` holds the measured `latency_s`, `prefill_s` and `decode_step_s` (any may be None)."""
    batch_size, input_len, output_len = workload
    prefill = [(input_len, input_len)] * batch_size
    decode = mean_decode_requests(batch_size, input_len, output_len)
    fields = {
        "decode_step_bytes": step_bytes(shape, decode),
        "prefill_flops": step_flops(shape, prefill),
        "latency_floor_s": None,
        "latency_roofline_fraction": None,
        "decode_hbm_fraction": None,
        "prefill_tensor_core_fraction": None,
    }
    if peak is None:
        return fields
    fields["latency_floor_s"] = batch_latency_floor_s(shape, batch_size, input_len, output_len, peak)
    if times.get("latency_s"):
        fields["latency_roofline_fraction"] = fields["latency_floor_s"] / times["latency_s"]
    if times.get("decode_step_s"):
        fields["decode_hbm_fraction"] = fields["decode_step_bytes"] / times["decode_step_s"] / peak.hbm_bytes_per_s
    if times.get("prefill_s"):
        fields["prefill_tensor_core_fraction"] = (
            fields["prefill_flops"] / times["prefill_s"] / peak.dense_bf16_flops_per_s
        )
    return fields


def throughput_roofline(
    shape: ModelShape, peak: DevicePeak | None, lengths: list[tuple[int, int]], elapsed_s: float
) -> dict:
    """Model FLOPs of a throughput run's (input_len, output_len) requests and the fraction of
    the tensor-core peak they reach over `elapsed_s` (model FLOPs utilization)."""
    flops = sum(request_flops(shape, i, o) for i, o in lengths)
    fraction = None if peak is None else flops / elapsed_s / peak.dense_bf16_flops_per_s
    return {"model_flops": flops, "tensor_core_fraction": fraction}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchmarks/configs/llama-3.1-8b", help="Directory with a config.json.")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--device-kind", default="NVIDIA H200", help=f"One of {sorted(DEVICE_PEAKS)}.")
    parser.add_argument(
        "--latency-json", default=None, help="A benchmarks.latency result: adds the fractions its measured times reach."
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.device_kind not in DEVICE_PEAKS:
        raise ValueError(f"device_kind must be one of {sorted(DEVICE_PEAKS)}, got {args.device_kind!r}.")
    shape = ModelShape.from_model_dir(args.model, args.dtype)
    peak = DEVICE_PEAKS[args.device_kind]
    workload = (args.batch_size, args.input_len, args.output_len)
    prefill = [(args.input_len, args.input_len)] * args.batch_size
    decode = mean_decode_requests(*workload)
    rows = [
        ["params", f"{shape.num_params:,}"],
        ["weight bytes read per step", f"{shape.weight_bytes_per_step:,}"],
        ["KV bytes per token", f"{shape.kv_bytes_per_token:,}"],
        ["decode step bytes (mean context)", f"{step_bytes(shape, decode):,.0f}"],
        ["decode step floor", f"{step_bytes(shape, decode) / peak.hbm_bytes_per_s * 1e3:.3f} ms"],
        ["prefill FLOPs", f"{step_flops(shape, prefill):,}"],
        ["prefill floor", f"{floor_s(shape, prefill, peak) * 1e3:.3f} ms"],
        ["whole-batch latency floor", f"{batch_latency_floor_s(shape, *workload, peak) * 1e3:.1f} ms"],
    ]
    if args.latency_json:
        with open(args.latency_json) as f:
            for run in json.load(f)["runs"]:
                rows.append(
                    [
                        f"batch {run['batch_size']}: latency / decode HBM / prefill TC fraction",
                        " / ".join(
                            fmt(run.get(k), ".1%")
                            for k in (
                                "latency_roofline_fraction",
                                "decode_hbm_fraction",
                                "prefill_tensor_core_fraction",
                            )
                        ),
                    ]
                )
    print(
        f"roofline: {args.model}, {args.dtype}, batch {args.batch_size}, {args.input_len} in, "
        f"{args.output_len} out, {args.device_kind}"
    )
    print_table(["quantity", "value"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
