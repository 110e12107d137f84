#!/usr/bin/env bash
# Llama-3.1-70B shapes (dummy bf16 weights) at TP 4 and TP 8 on the 4- and 8-GPU H200 kinds.
#
#   kind nvidia-h200-x8:  PYTHONPATH=/tmp/site:. bash benchmarks/h200_70b.sh 8     (carry .whl, .carry/smollm2)
#   kind nvidia-h200-x4:  PYTHONPATH=/tmp/site:. bash benchmarks/h200_70b.sh 4
#
# For the given TP size: vLLM's latency benchmark (32 in / 128 out, batch 8 and 1), the
# ShareGPT-like throughput run (200 prompts, vLLM's published 9.84 req/s at TP 4) and greedy
# tokens + decode latency + 1000 x 512/512 throughput from benchmarks.parallel, whose JSON from
# the TP 4 and TP 8 machines `python -m benchmarks.parallel --compare` checks for equal tokens.
# Each step writes JSON under $OUT and prints its table; a device call is limited to 10 minutes,
# so SUITE_ONLY="latency" (or "sharegpt", "parallel") runs one step.
set -u
TP=${1:?tensor parallel size}
OUT=${OUT:-/tmp/vjx-70b}
ONLY=${SUITE_ONLY:-latency sharegpt parallel}
mkdir -p "$OUT"
MODEL=(--model benchmarks/configs/llama-3.1-70b --tokenizer .carry/smollm2 --load-format dummy
       --dtype bfloat16 --max-model-len 2048)
for step in $ONLY; do
    case $step in
        latency) python3 -m benchmarks.latency "${MODEL[@]}" --tensor-parallel-size "$TP" --batch-size 8 1 --profile-host \
                     --output-json "$OUT/latency-tp$TP.json" ;;
        sharegpt) python3 -m benchmarks.throughput "${MODEL[@]}" --tensor-parallel-size "$TP" --dataset sharegpt-synthetic \
                      --num-prompts 200 --output-json "$OUT/sharegpt-tp$TP.json" ;;
        parallel) python3 -m benchmarks.parallel "${MODEL[@]}" --tp-sizes "$TP" \
                      --output-json "$OUT/parallel-tp$TP.json" ;;
    esac
done
