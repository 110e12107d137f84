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
import dataclasses
import json
import sys

from benchmarks.harness import fmt, print_table


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    hbm_bytes_per_s: float
    dense_bf16_flops_per_s: float


# Published peaks by JAX `device_kind` (torch's device name is the same string on NVIDIA).
DEVICE_PEAKS = {
    "NVIDIA H200": DevicePeak(hbm_bytes_per_s=4.8e12, dense_bf16_flops_per_s=989e12),
    "NVIDIA H100 80GB HBM3": DevicePeak(hbm_bytes_per_s=3.35e12, dense_bf16_flops_per_s=989e12),
}

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def dtype_bytes(dtype: str) -> int:
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPE_BYTES)}, got {dtype!r}.")
    return _DTYPE_BYTES[dtype]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    num_layers: int  # L
    hidden_size: int  # D
    num_heads: int  # N
    num_kv_heads: int  # K
    head_dim: int  # H
    intermediate_size: int  # F
    vocab_size: int  # V
    tie_word_embeddings: bool
    dtype_bytes: int  # b

    @classmethod
    def from_hf_config(cls, config: dict, dtype: str) -> "ModelShape":
        """From a config.json dict (or a transformers config's `to_dict()`)."""
        num_heads = config["num_attention_heads"]
        return cls(
            num_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes(dtype),
        )

    @classmethod
    def from_model_dir(cls, model_dir: str, dtype: str) -> "ModelShape":
        with open(f"{model_dir}/config.json") as f:
            return cls.from_hf_config(json.load(f), dtype)

    @property
    def layer_linear_params(self) -> int:
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        layer = self.layer_linear_params + 2 * self.hidden_size
        tables = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return tables + self.num_layers * layer + self.hidden_size

    @property
    def weight_bytes_per_step(self) -> int:
        """Weights a step reads whole: all but an untied embedding table."""
        params = self.num_params - (0 if self.tie_word_embeddings else self.embedding_params)
        return params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes


def step_bytes(shape: ModelShape, requests: list[tuple[int, int]]) -> int:
    """Bytes one step moves; `requests` holds (new tokens q, keys after the step s) each."""
    num_tokens = sum(q for q, _ in requests)
    kv_tokens = sum(s for _, s in requests) + num_tokens
    embed_rows = num_tokens * shape.hidden_size * shape.dtype_bytes
    return shape.weight_bytes_per_step + embed_rows + kv_tokens * shape.kv_bytes_per_token


def step_flops(shape: ModelShape, requests: list[tuple[int, int]]) -> int:
    """FLOPs of one step; `requests` holds (new tokens q, keys after the step s) each."""
    num_tokens = sum(q for q, _ in requests)
    # Query i (0-based) of q sees s - q + i + 1 keys: q*s - q*(q-1)/2 pairs in all.
    pairs = sum(q * s - q * (q - 1) // 2 for q, s in requests)
    linear = 2 * num_tokens * shape.num_layers * shape.layer_linear_params
    lm_head = 2 * len(requests) * shape.hidden_size * shape.vocab_size
    attention = 4 * shape.num_heads * shape.head_dim * shape.num_layers * pairs
    return linear + lm_head + attention


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
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPE_BYTES))
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
