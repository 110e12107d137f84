#!/usr/bin/env bash
# The H200 benchmark suite (issue #30's table), most important numbers first; a whole run takes
# several device calls (SUITE_ONLY picks each call's steps):
#   vjx_latency             latency 32 in / 128 out at batch 8, 1 and 64, sampled (temperature 1)
#                           and greedy, 5 timed runs each (batch 1 gives the decode-step roofline)
#   roofline_batch1         its roofline breakdown (no GPU)
#   hf_latency              HF transformers, same workload (static cache: transformers compiles
#                           the decode step with torch.compile, about a minute)
#   vjx_throughput_512x512  1000 requests of 512 in / 512 out, 3 timed runs (median, min, max)
#   hf_throughput_512x512   HF, 512 in / 512 out with FEWER requests (HF_THROUGHPUT_PROMPTS,
#                           default 256, one static batch of 256, dynamic cache), 3 runs
#   vjx_sharegpt_synthetic  ShareGPT-synthetic lengths, 1000 prompts, 3 runs
#   vjx_throughput_512x512_big, vjx_throughput_1000x1000, vjx_throughput_1000x1000_big
#                           the throughput rows with vjx's defaults and with BIG (max_num_seqs
#                           1024, max_num_batched_tokens 16384)
#   vjx_fp8_latency, vjx_fp8_throughput_512x512, vjx_fp8_throughput_1000x1000
#                           the same rows with quantization="fp8" (weights quantized at load)
#   vjx_kv_fp8_latency, vjx_kv_fp8_throughput_512x512   with kv_cache_dtype="fp8"
#   vjx_spec_decode         no drafts vs n-gram vs an EAGLE head (one layer, random weights) at
#                           batch 1 and 8, 3 runs each
#   vjx_structured          output tok/s with and without a JSON schema at batch 32, 3 runs each
#   moe_layers              one MoE layer's experts (benchmarks/moe.py) at the Qwen3-30B-A3B,
#                           gpt-oss-20b and Mixtral-8x7B shapes: grouped GEMM vs loop vs dense
#   vjx_qwen3_moe_throughput  Qwen3-30B-A3B (dummy bf16 weights, 61 GB), 256 requests 512 / 256
#   vjx_mixtral_throughput  Mixtral-8x7B (dummy bf16 weights, 93 GB: an H200), the same workload
#   vjx_qwen3_8b_latency, vjx_gemma3_12b_latency  latency 32 / 128 at batch 1 and 8 on the
#                           Qwen3-8B and Gemma-3-12B shapes (dummy bf16 weights)
#   startup_8b              start-up from an 8B safetensors checkpoint written to disk (random
#                           weights), cold and warm compilation cache, 3 runs each
#   plot                    PNG plots of every result
# Each step prints its table when done. Every step runs under `timeout`, the whole suite under
# SUITE_BUDGET_S: a step that would start with too little time left is skipped (a latency JSON
# keeps the batch sizes already done). SUITE_ONLY="name ..." runs only the steps named, e.g. the
# skipped ones in a second call (plot always runs).
#
# What comes back (the device tool returns at most 8 files): $OUT/summary.md (every table, and
# the stderr tail of any failed step), $OUT/results.tar.gz (each step's JSON, stdout and
# stderr; refreshed after every step), $OUT/table.md (benchmarks/table.py: every latency and
# throughput row, median with min and max) and $OUT/latency.png, $OUT/throughput.png.
#
# Run from the repository root with PYTHONPATH set, through the device tool with
# carry [".carry/smollm2"]:  PYTHONPATH=. bash benchmarks/h200_suite.sh
# Environment: OUT (required), VJX_GIT_SHA (the commit, recorded in every JSON: the device's copy
# of the tree has no .git), TOKENIZER (default .carry/smollm2: the llama-3.1-8b config
# directory has no tokenizer), VJX_ENGINE_ARGS (extra engine flags for every vjx run),
# SUITE_BUDGET_S (default 530), SUITE_ONLY, HF_THROUGHPUT_PROMPTS (default 256).
set -u

: "${OUT:?set OUT to the output directory}"
TOKENIZER=${TOKENIZER:-.carry/smollm2}
MODEL=benchmarks/configs/llama-3.1-8b
SUITE_BUDGET_S=${SUITE_BUDGET_S:-530}
SUITE_ONLY=${SUITE_ONLY:-}
HF_THROUGHPUT_PROMPTS=${HF_THROUGHPUT_PROMPTS:-256}
PLOT_RESERVE_S=20
WORK=$(mktemp -d /tmp/vjx-suite.XXXX)
SUMMARY=$OUT/summary.md
# Identical engine flags in every vjx run: later runs hit the persistent compilation cache.
# shellcheck disable=SC2206
ENGINE=(--model "$MODEL" --tokenizer "$TOKENIZER" --load-format dummy --dtype bfloat16
        --max-model-len 2048 ${VJX_ENGINE_ARGS:-})
# The second throughput configuration: 4x the requests and 2x the tokens of a step.
BIG=(--max-num-seqs 1024 --max-num-batched-tokens 16384)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SUITE_START=$SECONDS

publish() {
  tar czf "$OUT/results.tar.gz" -C "$WORK" .
}

# step NAME LIMIT_S COMMAND...: runs COMMAND under a timeout capped by the suite's time left.
step() {
  local name=$1 limit=$2 left t0 rc
  shift 2
  if [[ -n "$SUITE_ONLY" && " $SUITE_ONLY " != *" $name "* && $name != plot ]]; then
    return
  fi
  left=$((SUITE_BUDGET_S - PLOT_RESERVE_S - (SECONDS - SUITE_START)))
  if ((left < 30)); then
    echo "## $name: skipped, suite budget spent (run it with SUITE_ONLY=$name)" | tee -a "$SUMMARY"
    return
  fi
  ((limit > left)) && limit=$left
  echo "## $name (limit ${limit} s)" | tee -a "$SUMMARY"
  t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" 2>"$WORK/$name.err" \
    | tee "$WORK/$name.log" | tee -a "$SUMMARY"
  rc=${PIPESTATUS[0]}
  echo "## $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$SUMMARY"
  if ((rc != 0)); then
    tail -n 25 "$WORK/$name.err" | tee -a "$SUMMARY"
  fi
  publish
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$SUMMARY"

# latency ROWS...: vjx's latency rows (batch 8, 1, 64; sampled and greedy) with extra engine flags.
latency() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" python3 -m benchmarks.latency "${ENGINE[@]}" "$@" --batch-size 8 1 64 --temperature 1 0 \
    --input-len 32 --output-len 128 --num-iters-warmup 2 --num-iters 5 --output-json "$WORK/$name.json"
}

# throughput NAME LIMIT IN OUT [FLAGS...]: 1000 requests of IN in / OUT out, three timed runs.
throughput() {
  local name=$1 limit=$2 input=$3 output=$4
  shift 4
  step "$name" "$limit" python3 -m benchmarks.throughput "${ENGINE[@]}" "$@" --num-prompts 1000 \
    --input-len "$input" --output-len "$output" --num-iters 3 --output-json "$WORK/$name.json"
}

latency vjx_latency 300 --profile-host
if [[ -f "$WORK/vjx_latency.json" ]]; then
  step roofline_batch1 30 python3 -m benchmarks.roofline --batch-size 1 --input-len 32 --output-len 128 \
    --latency-json "$WORK/vjx_latency.json"
fi

# torch and JAX never share the GPU: each run is its own process.
step hf_latency 150 python3 -m benchmarks.baselines.hf_transformers latency --model "$MODEL" \
  --batch-size 8 1 --input-len 32 --output-len 128 --num-iters-warmup 1 --num-iters 5 \
  --cache-implementation static --output-json "$WORK/hf_latency.json"

throughput vjx_throughput_512x512 300 512 512

step hf_throughput_512x512 200 python3 -m benchmarks.baselines.hf_transformers throughput --model "$MODEL" \
  --num-prompts "$HF_THROUGHPUT_PROMPTS" --batch-size 256 --input-len 512 --output-len 512 --num-iters 3 \
  --cache-implementation dynamic --output-json "$WORK/hf_throughput_512x512.json"
if [[ -f "$WORK/hf_throughput_512x512.json" ]]; then
  echo "note: the HF throughput row ran $HF_THROUGHPUT_PROMPTS requests (not 1000) in static batches of 256" \
    | tee -a "$SUMMARY"
fi

step vjx_sharegpt_synthetic 150 python3 -m benchmarks.throughput "${ENGINE[@]}" --dataset sharegpt-synthetic \
  --num-prompts 1000 --num-iters 3 --output-json "$WORK/vjx_sharegpt_synthetic.json"
if [[ -f "$WORK/vjx_sharegpt_synthetic.json" ]]; then
  echo "reference: vLLM on H200, ShareGPT, 200 prompts: 22.6 req/s (published)" | tee -a "$SUMMARY"
fi

throughput vjx_throughput_512x512_big 300 512 512 "${BIG[@]}"
throughput vjx_throughput_1000x1000 450 1000 1000
throughput vjx_throughput_1000x1000_big 450 1000 1000 "${BIG[@]}"

latency vjx_fp8_latency 300 --quantization fp8
throughput vjx_fp8_throughput_512x512 300 512 512 --quantization fp8
throughput vjx_fp8_throughput_1000x1000 450 1000 1000 --quantization fp8
latency vjx_kv_fp8_latency 300 --kv-cache-dtype fp8
throughput vjx_kv_fp8_throughput_512x512 300 512 512 --kv-cache-dtype fp8

# Random weights: the n-gram and EAGLE drafts are rarely accepted, so these rows price the
# proposers' and the verification's overhead, not a speed-up (a real checkpoint's acceptance).
step vjx_spec_decode 400 python3 -m benchmarks.spec_decode --model "$MODEL" --tokenizer "$TOKENIZER" \
  --load-format dummy --dtype bfloat16 --max-model-len 2048 --max-num-batched-tokens 2048 --num-prompts 1 8 \
  --num-iters 3 --output-len 128 --eagle-head benchmarks/configs/llama-3.1-8b-eagle \
  --output-json "$WORK/vjx_spec_decode.json"
step vjx_structured 200 python3 -m benchmarks.structured "${ENGINE[@]}" --batch-sizes 32 --output-len 128 \
  --repeats 3 --output-json "$WORK/vjx_structured.json"

step moe_layers 150 bash -c 'for m in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b; do
  python3 -m benchmarks.moe --model "benchmarks/configs/$m" --num-tokens 1 16 256 2048 \
    --output-json "$0/moe_$m.json" || exit 1; done' "$WORK"
for moe_model in qwen3_moe:qwen3-30b-a3b mixtral:mixtral-8x7b; do
  step "vjx_${moe_model%%:*}_throughput" 240 python3 -m benchmarks.throughput \
    --model "benchmarks/configs/${moe_model#*:}" --tokenizer "$TOKENIZER" --load-format dummy --dtype bfloat16 \
    --max-model-len 2048 --num-prompts 256 --input-len 512 --output-len 256 \
    --output-json "$WORK/vjx_${moe_model%%:*}_throughput.json"
done

for shape in qwen3_8b:qwen3-8b gemma3_12b:gemma-3-12b; do
  step "vjx_${shape%%:*}_latency" 240 python3 -m benchmarks.latency --model "benchmarks/configs/${shape#*:}" \
    --tokenizer "$TOKENIZER" --load-format dummy --dtype bfloat16 --max-model-len 2048 --batch-size 8 1 \
    --input-len 32 --output-len 128 --num-iters-warmup 2 --num-iters 8 --output-json "$WORK/vjx_${shape%%:*}_latency.json"
done

step startup_8b 480 python3 -m benchmarks.startup --model "$MODEL" --tokenizer "$TOKENIZER" --dtype bfloat16 \
  --max-model-len 2048 --weights-dir /tmp/vjx-startup-8b --repeats 3 --output-json "$WORK/startup_8b.json"

PLOT_RESERVE_S=0 step plot 30 python3 -m benchmarks.plot "$WORK" --output-dir "$WORK"
python3 -m benchmarks.table "$WORK" --output "$OUT/table.md" >/dev/null 2>&1
cp "$WORK"/*.png "$OUT"/ 2>/dev/null
publish
echo "suite: $((SECONDS - SUITE_START)) s" | tee -a "$SUMMARY"
