#!/usr/bin/env bash
# `vjx serve` + `vjx bench serve` on the H200, in one device call: Llama-3.1-8B shapes with
# dummy bf16 weights behind the OpenAI server, Poisson load at rates 1, 4, 16 and inf.
#
#   PYTHONPATH=/tmp/site:. bash benchmarks/h200_serve.sh      (carry .whl and .carry/smollm2)
#
# The device image lacks the server's and the load generator's packages: carry wheels of
# fastapi, starlette, uvicorn, pydantic (+ pydantic-core, annotated-types, typing-inspection,
# typing-extensions), opentelemetry-api, pyzmq, msgspec, openai (+ httpx2, httpcore2, jiter,
# truststore, sniffio, anyio, idna, h11) and install them into /tmp/site first.
# Writes server.log, serve.json and the printed table under $OUT.
#
# #30's serving rows are 500 requests (128 in / 128 out) at each rate. Arrivals at 1 request/s
# alone take 500 s, so the rows need two device calls of at most 600 s each:
#   RATES="1" bash benchmarks/h200_serve.sh          and          RATES="4 16 inf" bash ...
# Environment: OUT, PORT (8000), NUM_PROMPTS (500), RATES ("1 4 16 inf"), DEVICE_NAME (for the
# record, "NVIDIA H200"), VJX_GIT_SHA (the commit: the device's copy of the tree has no .git).
set -u
OUT=${OUT:-/tmp/vjx-serve}
mkdir -p "$OUT"
PORT=${PORT:-8000}
NUM_PROMPTS=${NUM_PROMPTS:-500}
RATES=${RATES:-1 4 16 inf}
DEVICE_NAME=${DEVICE_NAME:-NVIDIA H200}
python3 -m serving.cli serve benchmarks/configs/llama-3.1-8b --tokenizer .carry/smollm2 \
    --load-format dummy --dtype bfloat16 --max-model-len 2048 --port "$PORT" \
    --access-log off >"$OUT/server.log" 2>&1 &
server=$!
start=$(date +%s)
until python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health')" 2>/dev/null; do
    if ! kill -0 "$server" 2>/dev/null || (( $(date +%s) - start > 300 )); then
        echo "server did not come up"; tail -30 "$OUT/server.log"; exit 1
    fi
    sleep 2
done
echo "server ready after $(( $(date +%s) - start )) s"
# shellcheck disable=SC2086  # RATES is a list of rates
python3 -m benchmarks.serve --base-url "http://127.0.0.1:$PORT" --request-rate $RATES \
    --num-prompts "$NUM_PROMPTS" --input-len 128 --output-len 128 --vocab-size 49152 \
    --platform gpu --device "$DEVICE_NAME" --output-json "$OUT/serve.json" | tee "$OUT/serve.txt"
kill -TERM "$server"
wait "$server"
tail -5 "$OUT/server.log"
