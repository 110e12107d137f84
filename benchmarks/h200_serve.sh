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
set -u
OUT=${OUT:-/tmp/vjx-serve}
mkdir -p "$OUT"
PORT=${PORT:-8000}
NUM_PROMPTS=${NUM_PROMPTS:-64}
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
python3 -m benchmarks.serve --base-url "http://127.0.0.1:$PORT" --request-rate 1 4 16 inf \
    --num-prompts "$NUM_PROMPTS" --input-len 128 --output-len 128 --vocab-size 49152 \
    --platform gpu --device "NVIDIA H200" --output-json "$OUT/serve.json" | tee "$OUT/serve.txt"
kill -TERM "$server"
wait "$server"
tail -5 "$OUT/server.log"
