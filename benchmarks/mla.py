"""One MLA layer's attention at a DeepSeek model's shapes: the absorbed form against the
expanded one (vjx/attention/mla.py), for a fresh prompt and for a decode batch.

    python -m benchmarks.mla --model benchmarks/configs/deepseek-v2-lite \
        --prefill-lens 512 2048 --decode-batches 1 16 --context-len 2048 --output-json mla.json

Shapes come from the config (heads, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
`v_head_dim`). Each case is one step of the jnp attention with the latents already written,
jitted with random inputs as arguments: `prefill` one row of L new tokens and no context;
`decode` B rows of one token over `--context-len` cached tokens each. The engine picks the
absorbed form for steps of one-token rows and the expanded form for the rest; this times both
on both, best of `--repeats` means of pipelined calls.
"""

import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from vjx.attention.metadata import AttentionMetadata
from vjx.attention.mla import UpProjection, absorbed_attention, expanded_attention

HEADER = ["case", "rows", "tokens", "keys / row", "absorbed ms", "expanded ms", "absorbed / expanded"]
_CALLS = 3
_BLOCK_SIZE = 16


def mla_shape(config: dict) -> dict[str, int]:
    return {
        "num_heads": config["num_attention_heads"],
        "kv_lora_rank": config["kv_lora_rank"],
        "nope_dim": config["qk_nope_head_dim"],
        "rope_dim": config["qk_rope_head_dim"],
        "value_dim": config["v_head_dim"],
    }


def step_metadata(num_rows: int, query_len: int, context_len: int) -> AttentionMetadata:
    """`num_rows` rows of `query_len` new tokens after `context_len` cached ones, each row on
    its own contiguous blocks (block 0 left as the scratch block)."""
    seq_len = context_len + query_len
    width = -(-seq_len // _BLOCK_SIZE)
    block_tables = 1 + np.arange(num_rows * width, dtype=np.int32).reshape(num_rows, width)
    positions = np.arange(context_len, seq_len)
    slots = block_tables[:, positions // _BLOCK_SIZE] * _BLOCK_SIZE + positions % _BLOCK_SIZE
    return AttentionMetadata(
        slot_mapping=jnp.asarray(slots.reshape(-1)),
        query_start_loc=jnp.asarray(np.arange(num_rows + 1, dtype=np.int32) * query_len),
        seq_lens=jnp.full((num_rows,), seq_len, jnp.int32),
        block_tables=jnp.asarray(block_tables),
        num_seqs=jnp.asarray([num_rows], jnp.int32),
    )


def _time_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(_CALLS):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / _CALLS)
    return best * 1e3


def time_case(shape: dict[str, int], num_rows: int, query_len: int, context_len: int, dtype, repeats: int) -> dict:
    md = step_metadata(num_rows, query_len, context_len)
    N, R, P, E, V = (shape[k] for k in ("num_heads", "kv_lora_rank", "nope_dim", "rope_dim", "value_dim"))
    num_tokens, num_blocks = num_rows * query_len, int(md.block_tables.max()) + 1
    keys = jax.random.split(jax.random.key(num_tokens + context_len), 5)
    q = jax.random.normal(keys[0], (num_tokens, N, P + E), dtype)
    latent = jax.random.normal(keys[1], (num_tokens, R + E), dtype)
    kv_cache = jax.random.normal(keys[2], (num_blocks, _BLOCK_SIZE, R + E), dtype)
    up = UpProjection(
        jax.random.normal(keys[3], (R, N, P), dtype) * R**-0.5, jax.random.normal(keys[4], (R, N, V), dtype) * R**-0.5
    )
    scale = (P + E) ** -0.5
    absorbed = jax.jit(lambda q, c, md, up: absorbed_attention(q, c, md, up, sm_scale=scale))
    expanded = jax.jit(lambda q, lat, c, md, up: expanded_attention(q, lat, c, md, up, sm_scale=scale))
    return {
        "absorbed_ms": _time_ms(absorbed, (q, kv_cache, md, up), repeats),
        "expanded_ms": _time_ms(expanded, (q, latent, kv_cache, md, up), repeats),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A directory with a DeepSeek config.json.")
    parser.add_argument("--prefill-lens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    if min(args.prefill_lens + args.decode_batches + [args.context_len, args.repeats]) < 1:
        raise ValueError("prefill_lens, decode_batches, context_len and repeats must all be >= 1.")
    shape = mla_shape(json.loads((pathlib.Path(args.model) / "config.json").read_text()))
    platform_name, device = harness.jax_device()
    result = harness.run_metadata("mla", harness.ENGINE_NAME, platform_name, device, args.model)
    result.update({**shape, "dtype": args.dtype, "repeats": args.repeats, "runs": []})
    cases = [("prefill", 1, n, 0) for n in args.prefill_lens]
    cases += [("decode", b, 1, args.context_len) for b in args.decode_batches]
    harness.print_header(HEADER)
    for case, num_rows, query_len, context_len in cases:
        times = time_case(shape, num_rows, query_len, context_len, jnp.dtype(args.dtype), args.repeats)
        run = {"case": case, "num_rows": num_rows, "query_len": query_len, "context_len": context_len, **times}
        result["runs"].append(run)
        ratio = times["absorbed_ms"] / times["expanded_ms"]
        harness.print_row(
            [case, str(num_rows), str(num_rows * query_len), str(context_len + query_len)]
            + [f"{times['absorbed_ms']:.2f}", f"{times['expanded_ms']:.2f}", f"{ratio:.2f}"]
        )
        harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
