#!/usr/bin/env bash
# Starts two simulated model servers and thaw in front of them on
# config/demo.json, prints what to try, and stops everything on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
SIM=./build/thaw-model-sim
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

"$SIM" --port 18101 --model meta-llama/Llama-3.1-8B-Instruct --token-ms 40 --tokens 12 &
pids+=($!)
"$SIM" --port 18102 --model mistralai/Mistral-7B-Instruct-v0.3 --token-ms 60 --tokens 8 \
    --capacity 2 &
pids+=($!)

cat <<'MSG'

thaw demo: two simulated models behind thaw on 127.0.0.1:8080 (admin on :9090).
Try, in another terminal:

  # route by the OpenAI "model" field, streamed token by token
  curl -N http://127.0.0.1:8080/v1/chat/completions \
       -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"messages":[]}'

  # route by path prefix, as a batch-tier request
  curl http://127.0.0.1:8080/models/mistral/v1/completions -H 'thaw-priority: batch' \
       -d '{"model":"x","prompt":"hi"}'

  # route by Host, the way a Kubernetes Service name reaches thaw
  curl http://127.0.0.1:8080/v1/models -H 'Host: llama.models.svc.cluster.local'

  # what thaw sees
  curl http://127.0.0.1:9090/status
  curl http://127.0.0.1:9090/metrics

Ctrl-C stops thaw and the simulators.

MSG
./build/thaw --config config/demo.json &
pids+=($!)
wait "${pids[-1]}"
