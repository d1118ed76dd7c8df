#!/usr/bin/env bash
# Starts thaw on config/demo.json: two simulated models that are local
# commands, started on their first request (a cold start of 2-3 s) and
# stopped after 30 s idle. Prints what to try; Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

cat <<'MSG'

thaw demo: two models, scaled to zero, on one simulated GPU with 4 slices.
thaw listens on 127.0.0.1:8080 (admin: 127.0.0.1:9090). In another terminal:

  # a cold start: the first request starts the model (about 3 s), later ones are instant
  time curl -s http://127.0.0.1:8080/v1/completions \
       -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hello"}'

  # streaming: tokens arrive one by one (": loading" heartbeats while a model is cold)
  curl -N http://127.0.0.1:8080/v1/chat/completions \
       -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"messages":[]}'

  # route by path prefix or by Host, as a batch-tier request
  curl http://127.0.0.1:8080/models/mistral/v1/completions -H 'thaw-priority: batch' \
       -d '{"model":"x","prompt":"hi"}'
  curl http://127.0.0.1:8080/v1/models -H 'Host: mistral.models.svc.cluster.local'

  # what thaw sees: model states, replicas, GPU slices, queues; then metrics
  curl -s http://127.0.0.1:9090/status
  curl -s http://127.0.0.1:9090/metrics | grep -E 'thaw_(cold_start|requests_total|queue_depth)'

After 30 s without requests each model scales back to zero (watch the log).
Ctrl-C stops thaw and its model processes.

MSG
exec ./build/thaw --config config/demo.json
