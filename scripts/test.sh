#!/usr/bin/env bash
# The whole test suite: unit and end-to-end tests, the same again under
# ASan+UBSan, a short fuzzing run, and the benchmarks in smoke mode.
# Expects scripts/setup.sh to have installed and built (it calls this).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=/usr/bin/python3   # Debian's, where python3-pytest lives
export PYTHONDONTWRITEBYTECODE=1
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

status=0
step() { echo; echo "=== $*"; }

build() {
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >/dev/null
    fi
    ninja -C "$dir" >/dev/null
}

step "unit tests"
meson test -C build --suite unit --print-errorlogs || status=1

step "end-to-end tests"
(cd tests/e2e && THAW_BIN="$ROOT/build/thaw" THAW_SIM_BIN="$ROOT/build/thaw-model-sim" \
    $PY -m pytest -q -p no:cacheprovider .) || status=1

step "counterparts: independent model servers"
(cd tests/counterparts && $PY -m pytest -q -p no:cacheprovider .) || status=1

step "ASan+UBSan build: unit and end-to-end tests"
build build-asan -Db_sanitize=address,undefined -Db_lundef=false
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
meson test -C build-asan --suite unit --print-errorlogs || status=1
(cd tests/e2e && THAW_BIN="$ROOT/build-asan/thaw" THAW_SIM_BIN="$ROOT/build-asan/thaw-model-sim" \
    THAW_SANITIZED=1 $PY -m pytest -q -p no:cacheprovider .) || status=1
unset ASAN_OPTIONS UBSAN_OPTIONS

step "fuzzing the request parser and router (smoke: 20 s)"
CC=clang build build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
corpus=$(mktemp -d)
cp tests/fuzz/corpus/request/* "$corpus"/
./build-fuzz/tests/fuzz_request -max_total_time=20 -max_len=4096 "$corpus" 2>&1 | tail -1 || status=1
rm -rf "$corpus"

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
