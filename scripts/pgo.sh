#!/usr/bin/env bash
# Builds loopguard with profile-guided optimisation into target/pgo/loopguard
# (`make release`; the Dockerfile and `make bench` use it).
#
#   1. an instrumented build (target/pgo/gen);
#   2. training: a nats-server (JetStream on) on a free loopback port, the
#      instrumented loopguard with every rule of the contract and every event
#      on, and examples/pgo_train.rs publishing the relay benchmark's
#      workload (PGO_TRAIN_MESSAGES at PGO_TRAIN_RATE a second), then a
#      tenth as many through loopguard's JetStream ingest;
#   3. the optimised build from that profile (target/pgo/use).
#
# Needs llvm-profdata of rustc's own LLVM (rustup's llvm-tools component,
# added here when missing; or set LLVM_PROFDATA) and nats-server.
# Measured: about a tenth less CPU per message than the plain release build
# (docs/benchmarks.md).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/pgo
messages=${PGO_TRAIN_MESSAGES:-300000}
rate=${PGO_TRAIN_RATE:-20000}
cargo=${CARGO:-cargo}

host=$(rustc -vV | sed -n 's/^host: //p')
profdata=${LLVM_PROFDATA:-$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata}
if [ ! -x "$profdata" ] && [ -z "${LLVM_PROFDATA:-}" ] && command -v rustup >/dev/null; then
    echo "pgo: adding rustup's llvm-tools component (llvm-profdata)"
    rustup component add llvm-tools
fi
[ -x "$profdata" ] || { echo "pgo: no llvm-profdata at $profdata (rustup component add llvm-tools, or set LLVM_PROFDATA)" >&2; exit 1; }
nats_server=${NATS_SERVER:-$(command -v nats-server || ls /usr/sbin/nats-server 2>/dev/null || true)}
[ -n "$nats_server" ] || { echo "pgo: nats-server not found (Debian: apt-get install nats-server)" >&2; exit 1; }

rm -rf "$out/train" "$out/run"
mkdir -p "$out/train" "$out/run"

echo "pgo: 1/3 instrumented build"
# Build scripts are instrumented too and write their profiles into the
# -Cprofile-generate directory; loopguard's go to $out/train (below).
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$out/run" \
    "$cargo" build --release --locked --bin loopguard --target-dir "$out/gen"
"$cargo" build --release --locked --example pgo_train
trainer=${CARGO_TARGET_DIR:-$root/target}/release/examples/pgo_train

echo "pgo: 2/3 training: $messages messages at $rate/s, then a tenth as many through JetStream"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$nats_server" -a 127.0.0.1 -p -1 -js -sd "$out/run/js" --ports_file_dir "$out/run" >/dev/null 2>&1 &
nats_pid=$!
pids+=("$nats_pid")
url=
for _ in $(seq 100); do
    url=$(sed -n 's/.*"nats":\["\([^"]*\)".*/\1/p' "$out"/run/*.ports 2>/dev/null || true)
    [ -n "$url" ] && break
    sleep 0.1
done
[ -n "$url" ] || { echo "pgo: nats-server did not start" >&2; exit 1; }

# One run of the instrumented loopguard, with core NATS ingest or with
# JetStream's (the no-loss mode: untrained, its code would be laid out as
# cold). It stops on SIGTERM, as in production, and writes its profile.
train() {
    local jetstream=$1 messages=$2 rate=$3
    cat >"$out/run/train.toml" <<EOF
[nats]
url = "$url"
subscription_capacity = 1048576
[nats.jetstream]
enabled = $jetstream
storage = "memory"
[http]
listen = "127.0.0.1:0"
[events]
approved = true
EOF
    cat benches/shared/loopguard.toml >>"$out/run/train.toml"
    LLVM_PROFILE_FILE="$out/train/loopguard-%p.profraw" \
        "$out/gen/release/loopguard" --config "$out/run/train.toml" &
    local lg_pid=$!
    pids+=("$lg_pid")
    "$trainer" "$url" "$messages" "$rate"
    sleep 2 # what is still queued is decided and published
    kill -TERM "$lg_pid"
    wait "$lg_pid" || { echo "pgo: the instrumented loopguard did not stop cleanly" >&2; exit 1; }
}
train false "$messages" "$rate"
train true "$((messages / 10))" "$((rate / 2))"
count=$(ls "$out"/train/loopguard-*.profraw 2>/dev/null | wc -l)
[ "$count" = 2 ] || { echo "pgo: expected 2 profiles from loopguard, found $count" >&2; exit 1; }
"$profdata" merge -o "$out/loopguard.profdata" "$out"/train/loopguard-*.profraw

echo "pgo: 3/3 optimised build"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$out/loopguard.profdata" \
    "$cargo" build --release --locked --bin loopguard --target-dir "$out/use"
cp "$out/use/release/loopguard" "$out/loopguard"
echo "pgo: built $out/loopguard"
