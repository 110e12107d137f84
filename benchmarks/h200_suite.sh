#!/usr/bin/env bash
# The H200 benchmark suite in one device call (<= 9 minutes wall), most important numbers first:
#   vjx_latency             vjx latency 32 in / 128 out, batch 8 then batch 1 (target <= 600 ms;
#                           batch 1 gives the decode-step roofline)
#   roofline_batch1         its roofline breakdown (no GPU)
#   hf_latency              HF transformers, same workload (static cache: transformers compiles
#                           the decode step, about a minute; 4x faster than its dynamic cache)
#   vjx_throughput_512x512  vjx, 1000 requests of 512 in / 512 out (target >= 12,000 output tok/s)
#   hf_throughput_512x512   HF, 512 in / 512 out with FEWER requests (HF_THROUGHPUT_PROMPTS,
#                           default 256, one static batch of 256, dynamic cache): HF's generate
#                           is too slow for 1000 in the budget
#   vjx_sharegpt_synthetic  vjx, ShareGPT-synthetic, 200 prompts (vLLM publishes 22.6 req/s on H200)
#   moe_layers              one MoE layer's experts (benchmarks/moe.py) at the Qwen3-30B-A3B,
#                           gpt-oss-20b and Mixtral-8x7B shapes: grouped GEMM vs loop vs dense
#   vjx_qwen3_moe_throughput  Qwen3-30B-A3B (dummy bf16 weights, 61 GB), 256 requests 512 / 256
#   vjx_mixtral_throughput  Mixtral-8x7B (dummy bf16 weights, 93 GB: an H200), the same workload
#   vjx_latency_greedy      the latency rows at temperature 0 (batch 8, 1, 64)
#   vjx_throughput_1000x1000  vjx, 1000 requests of 1000 in / 1000 out
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
# stderr; refreshed after every step) and $OUT/latency.png, $OUT/throughput.png.
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

step vjx_latency 300 python3 -m benchmarks.latency "${ENGINE[@]}" --batch-size 8 1 64 --profile-host \
  --input-len 32 --output-len 128 --num-iters-warmup 2 --num-iters 8 --output-json "$WORK/vjx_latency.json"
if [[ -f "$WORK/vjx_latency.json" ]]; then
  step roofline_batch1 30 python3 -m benchmarks.roofline --batch-size 1 --input-len 32 --output-len 128 \
    --latency-json "$WORK/vjx_latency.json"
fi

# torch and JAX never share the GPU: each run is its own process.
step hf_latency 150 python3 -m benchmarks.baselines.hf_transformers latency --model "$MODEL" \
  --batch-size 8 1 --input-len 32 --output-len 128 --num-iters-warmup 1 --num-iters 5 \
  --cache-implementation static --output-json "$WORK/hf_latency.json"

step vjx_throughput_512x512 240 python3 -m benchmarks.throughput "${ENGINE[@]}" --num-prompts 1000 \
  --input-len 512 --output-len 512 --output-json "$WORK/vjx_throughput_512x512.json"

step hf_throughput_512x512 100 python3 -m benchmarks.baselines.hf_transformers throughput --model "$MODEL" \
  --num-prompts "$HF_THROUGHPUT_PROMPTS" --batch-size 256 --input-len 512 --output-len 512 \
  --cache-implementation dynamic --output-json "$WORK/hf_throughput_512x512.json"
if [[ -f "$WORK/hf_throughput_512x512.json" ]]; then
  echo "note: the HF throughput row ran $HF_THROUGHPUT_PROMPTS requests (not 1000) in static batches of 256" \
    | tee -a "$SUMMARY"
fi

step vjx_sharegpt_synthetic 100 python3 -m benchmarks.throughput "${ENGINE[@]}" --dataset sharegpt-synthetic \
  --num-prompts 200 --output-json "$WORK/vjx_sharegpt_synthetic.json"
if [[ -f "$WORK/vjx_sharegpt_synthetic.json" ]]; then
  echo "reference: vLLM on H200, ShareGPT, 200 prompts: 22.6 req/s (published)" | tee -a "$SUMMARY"
fi

step moe_layers 150 bash -c 'for m in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b; do
  python3 -m benchmarks.moe --model "benchmarks/configs/$m" --num-tokens 1 16 256 2048 \
    --output-json "$0/moe_$m.json" || exit 1; done' "$WORK"
for moe_model in qwen3_moe:qwen3-30b-a3b mixtral:mixtral-8x7b; do
  step "vjx_${moe_model%%:*}_throughput" 240 python3 -m benchmarks.throughput \
    --model "benchmarks/configs/${moe_model#*:}" --tokenizer "$TOKENIZER" --load-format dummy --dtype bfloat16 \
    --max-model-len 2048 --num-prompts 256 --input-len 512 --output-len 256 \
    --output-json "$WORK/vjx_${moe_model%%:*}_throughput.json"
done

step vjx_latency_greedy 300 python3 -m benchmarks.latency "${ENGINE[@]}" --batch-size 8 1 64 --temperature 0 \
  --input-len 32 --output-len 128 --num-iters-warmup 2 --num-iters 8 --output-json "$WORK/vjx_latency_greedy.json"

step vjx_throughput_1000x1000 400 python3 -m benchmarks.throughput "${ENGINE[@]}" --num-prompts 1000 \
  --input-len 1000 --output-len 1000 --output-json "$WORK/vjx_throughput_1000x1000.json"

for shape in qwen3_8b:qwen3-8b gemma3_12b:gemma-3-12b; do
  step "vjx_${shape%%:*}_latency" 240 python3 -m benchmarks.latency --model "benchmarks/configs/${shape#*:}" \
    --tokenizer "$TOKENIZER" --load-format dummy --dtype bfloat16 --max-model-len 2048 --batch-size 8 1 \
    --input-len 32 --output-len 128 --num-iters-warmup 2 --num-iters 8 --output-json "$WORK/vjx_${shape%%:*}_latency.json"
done

step startup_8b 480 python3 -m benchmarks.startup --model "$MODEL" --tokenizer "$TOKENIZER" --dtype bfloat16 \
  --max-model-len 2048 --weights-dir /tmp/vjx-startup-8b --repeats 3 --output-json "$WORK/startup_8b.json"

PLOT_RESERVE_S=0 step plot 30 python3 -m benchmarks.plot "$WORK" --output-dir "$WORK"
cp "$WORK"/*.png "$OUT"/ 2>/dev/null
publish
echo "suite: $((SECONDS - SUITE_START)) s" | tee -a "$SUMMARY"
