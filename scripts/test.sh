#!/usr/bin/env bash
# The whole test suite: unit and end-to-end tests, the same again under
# ASan+UBSan, short fuzzing runs of every parser of outside input, and the benchmarks in smoke mode.
# Expects scripts/setup.sh to have installed and built (it calls this).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=/usr/bin/python3   # Debian's, where python3-pytest lives
export PYTHONDONTWRITEBYTECODE=1
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# End-to-end tests spend most of their time waiting on thaw's timers and on
# simulated cold starts, so three run at once (each on its own ports and
# processes); THAW_TEST_JOBS=0 runs them one by one.
# Tests marked with an xdist_group run on one worker, one after another.
JOBS=(-n "${THAW_TEST_JOBS:-3}")
if [ "${THAW_TEST_JOBS:-3}" != 0 ]; then
    JOBS+=(--dist loadgroup)
fi

status=0
step() { echo; echo "=== $*"; }

build() {
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >/dev/null
    fi
    ninja -C "$dir" >/dev/null
}

step "layers: no module includes one of a higher layer"
$PY scripts/check_layers.py "$ROOT" || status=1

step "unit tests"
meson test -C build --suite unit --print-errorlogs || status=1

step "end-to-end tests"
(cd tests/e2e && THAW_BIN="$ROOT/build/thaw" THAW_SIM_BIN="$ROOT/build/thaw-model-sim" \
    $PY -m pytest -q -p no:cacheprovider "${JOBS[@]}" .) || status=1

step "counterparts: independent model servers"
(cd tests/counterparts && $PY -m pytest -q -p no:cacheprovider .) || status=1

step "ASan+UBSan build: unit and end-to-end tests"
build build-asan -Db_sanitize=address,undefined -Db_lundef=false
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
meson test -C build-asan --suite unit --print-errorlogs || status=1
# Every end-to-end test that runs thaw's code, but those that mostly wait on
# its timers (shorter tests run the same code); the simulator's own tests,
# the chart rendering and the cost simulation's output are not thaw under test.
(cd tests/e2e && THAW_BIN="$ROOT/build-asan/thaw" THAW_SIM_BIN="$ROOT/build-asan/thaw-model-sim" \
    THAW_SANITIZED=1 $PY -m pytest -q -p no:cacheprovider "${JOBS[@]}" . -m "not timer_heavy" \
    --ignore=test_kube_sim.py --ignore=test_charts.py --ignore=test_costsim.py) || status=1
unset ASAN_OPTIONS UBSAN_OPTIONS

step "fuzzing every parser of outside input (smoke: request 12 s, the others 6 s each)"
CC=clang build build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
# fuzz NAME SECONDS MAX_LEN: a run from the target's seed corpus (copied, so
# the checked-in corpus stays small); a crash, hang, leak or UB fails it and
# the failing input is kept under build-fuzz/artifacts/.
fuzz() {
    local name=$1 secs=$2 max_len=$3 corpus log
    corpus=$(mktemp -d)
    log=$(mktemp)
    cp tests/fuzz/corpus/"$name"/* "$corpus"/
    mkdir -p build-fuzz/artifacts
    if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ./build-fuzz/tests/fuzz_"$name" -max_total_time="$secs" -max_len="$max_len" \
        -timeout=10 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/artifacts/"$name"- \
        "$corpus" >"$log" 2>&1; then
        echo "fuzz_$name: $(grep '^Done' "$log")"
    else
        echo "fuzz_$name: FAILED"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -20
        status=1
    fi
    rm -rf "$corpus" "$log"
}
fuzz request 12 4096
fuzz response 6 4096
fuzz config 6 8192
fuzz kubeconfig 6 4096
fuzz k8s_objects 6 8192
fuzz execcred 6 2048
fuzz formscan 6 4096
fuzz jsonscan 6 4096

step "benchmarks (smoke mode: figures only, never pass/fail on time)"
SMOKE=1 ./loadtest/bench_proxy.sh || status=1
./build/thaw-costsim --seed 1 --hours 6 || status=1

echo
if [ $status -eq 0 ]; then
    echo "thaw test suite: all steps passed"
else
    echo "thaw test suite: FAILED (see above)"
fi
exit $status
