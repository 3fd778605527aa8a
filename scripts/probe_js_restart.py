#!/usr/bin/env python3
"""Does a core-NATS publish into a stream survive a nats-server restart?

loopguard publishes egress copies with core NATS and, in JetStream mode,
acknowledges a message once the server has received its copies (a flush).
This probe asks what an egress stream then holds across a server restart:
it publishes N messages on subjects a stream captures, flushes, stops the
server at once (SIGTERM, or SIGKILL with `kill`), starts it again on the
same store and counts what the stream holds. Not part of `make test`; see
docs/operations.md, "A NATS restart and the egress stream".

    python3 scripts/probe_js_restart.py [term|kill] [rounds] [messages]
"""
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import nats


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port, store):
    server = subprocess.Popen(
        ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(250):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return server
        except OSError:
            time.sleep(0.02)
    raise SystemExit("nats-server did not start")


async def round_trip(sig, count):
    store, port = tempfile.mkdtemp(), free_port()
    server = start(port, store)
    nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
    await nc.jetstream().add_stream(name="EGRESS", subjects=["egress.>"])
    for i in range(count):
        await nc.publish(f"egress.{i % 7}", b"x" * 300)
    await nc.flush()  # the server has received every message
    os.kill(server.pid, sig)
    server.wait()
    try:
        await nc.close()
    except Exception:
        pass
    server = start(port, store)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    held = None
    for _ in range(50):
        try:
            held = (await nc.jetstream().stream_info("EGRESS")).state.messages
            break
        except Exception:
            await asyncio.sleep(0.1)
    await nc.close()
    server.kill()
    server.wait()
    return held


async def main():
    how = sys.argv[1] if len(sys.argv) > 1 else "term"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    sig = signal.SIGKILL if how == "kill" else signal.SIGTERM
    held = [await round_trip(sig, count) for _ in range(rounds)]
    lost = sum(count - h for h in held)
    print(f"SIG{sig.name[3:]} right after the flush: the stream held {held} of {count} each;")
    print(f"lost {lost} of {rounds * count} ({100 * lost / (rounds * count):.1f}%)")


asyncio.run(main())
