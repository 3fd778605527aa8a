#!/usr/bin/env bash
# `make demo`: a nats-server of its own and loopguard on its defaults (but
# for the addresses: each on a free loopback port, so a NATS or a loopguard
# already running here is neither used nor in the way), then the demo's
# two scripted agents that would loop forever (target/debug/examples/demo,
# built by make). Everything started here stops at the end.
set -euo pipefail
log=${DEMO_LOG:-target/demo-loopguard.log}
nats=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
run=$(mktemp -d)
nats_pid='' lg_pid=''
# loopguard first, waited for: with its server gone first, it would wait out
# its grace period, running on after the demo ended. Both run in sessions of
# their own, so that Ctrl-C reaches the script (and the demo agents) alone
# and they stop here, in this order.
stop() {
    # A second Ctrl-C (or the terminal closing) must not cut this short:
    # the children, in their own sessions, would be left running.
    trap '' INT TERM HUP
    if [ -n "$lg_pid" ]; then kill -TERM "$lg_pid" 2>/dev/null || true; wait "$lg_pid" 2>/dev/null || true; fi
    if [ -n "$nats_pid" ]; then kill "$nats_pid" 2>/dev/null || true; wait "$nats_pid" 2>/dev/null || true; fi
    rm -rf "$run"
}
trap stop EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP

# Waits (10 s at most) for the command to print something, and prints it.
wait_for() {
    local what=$1 pid=$2 found
    shift 2
    for _ in $(seq 100); do
        found=$("$@" 2>/dev/null || true)
        if [ -n "$found" ]; then echo "$found"; return; fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "$what did not start" >&2
    return 1
}

# loopguard on its defaults: none of the caller's LOOPGUARD* settings (a
# prefix, a rule or a config file there would change or break the scenes).
for name in $(compgen -e); do
    case $name in LOOPGUARD*) unset "$name" ;; esac
done

setsid "$nats" -a 127.0.0.1 -p -1 --ports_file_dir "$run" 2>"$run/nats.log" &
nats_pid=$!
# Its ports file, named after its executable: the only one in $run.
ports_url() { sed -n 's/.*"nats":\["\([^"]*\)".*/\1/p' "$run"/*.ports; }
nats_url=$(wait_for nats-server $nats_pid ports_url) \
    || { cat "$run/nats.log" >&2; exit 1; }

LOOPGUARD__NATS__URL=$nats_url LOOPGUARD__HTTP__LISTEN=127.0.0.1:0 \
    LOOPGUARD__LOG__FORMAT=text RUST_LOG=info \
    setsid target/debug/loopguard 2>"$log" &
lg_pid=$!
http=$(wait_for loopguard $lg_pid \
    sed -n 's/.*http listening.*addr=\([0-9.:]*\).*/\1/p' "$log") \
    || { cat "$log" >&2; exit 1; }

NATS_URL=$nats_url LOOPGUARD__HTTP__LISTEN=$http target/debug/examples/demo
echo
echo "loopguard's log: $log"
