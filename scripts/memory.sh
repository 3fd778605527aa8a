#!/usr/bin/env bash
# `make memory`: resident memory of a release loopguard under floods of unique
# worlds (far beyond state.max_worlds), agents, threads and contents.
# Prints a table; every phase waits until loopguard decided what was sent.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_WORLDS=${MAX_WORLDS:-10000}
cargo build --release --bin loopguard --example flood
NATS=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
tmp=$(mktemp -d)
lg_pid=''
$NATS -a 127.0.0.1 -p -1 --ports_file_dir "$tmp" >/dev/null 2>&1 & nats_pid=$!
trap 'kill $lg_pid $nats_pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do ls "$tmp"/*.ports >/dev/null 2>&1 && break; sleep 0.05; done
url=$(python3 -c 'import glob,json,sys; print(json.load(open(glob.glob(sys.argv[1]+"/*.ports")[0]))["nats"][0])' "$tmp")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
LOOPGUARD__NATS__URL=$url LOOPGUARD__HTTP__LISTEN=127.0.0.1:$port \
LOOPGUARD__STATE__MAX_WORLDS=$MAX_WORLDS LOOPGUARD__RULES__RATE__MAX=0 LOOPGUARD__RULES__TURNS__MAX=0 \
LOOPGUARD__RULES__DEPTH__MAX=0 LOOPGUARD__NATS__SUBSCRIPTION_CAPACITY=1000000 \
  target/release/loopguard 2>"$tmp/loopguard.log" & lg_pid=$!
ready=''
for _ in $(seq 200); do curl -sf "127.0.0.1:$port/readyz" >/dev/null 2>&1 && { ready=1; break; }; sleep 0.05; done
[ -n "$ready" ] || { echo "loopguard is not ready:"; cat "$tmp/loopguard.log"; exit 1; } >&2
echo "loopguard (release), state.max_worlds = $MAX_WORLDS, $(nproc) CPUs, $(date -u +%F)"
target/release/examples/flood "$url" "$lg_pid" "127.0.0.1:$port" "$MAX_WORLDS"
