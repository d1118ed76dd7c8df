#!/usr/bin/env bash
# Runs the proxy benchmark, the idle-connection memory test, the cold-start load test,
# the Kubernetes load test and the SSE streaming benchmark.
# SMOKE=1 keeps them short (CI); figures are printed, nothing fails on time.
set -euo pipefail
cd "$(dirname "$0")"
ulimit -n 65536 2>/dev/null || true
/usr/bin/python3 bench_proxy.py
/usr/bin/python3 idle_conns.py
/usr/bin/python3 coldstart.py
/usr/bin/python3 k8s_bench.py
/usr/bin/python3 sse_bench.py
