#!/usr/bin/env python3
"""Does a publish into a stream survive a nats-server restart?

In JetStream mode loopguard acknowledges a message once its egress copies
are settled: answered by the server as JetStream publishes (`egress_acks`,
the default), or only flushed as core publishes (`egress_acks = false`).
This probe asks what an egress stream holds across a server restart after
either: it publishes N messages on subjects a stream captures, as core
publishes and a flush (`core`) or as JetStream publishes whose answers it
awaits (`acked`), stops the server at once (SIGTERM, or SIGKILL with
`kill`), starts it again on the same store and counts what the stream
holds. Not part of `make test`; see docs/operations.md, "A NATS restart and
the egress stream".

    python3 scripts/probe_js_restart.py [term|kill] [rounds] [messages] [core|acked]
"""
import asyncio
import os
import signal
import sys
import tempfile

import nats

from nats_probe import free_port, start


async def round_trip(sig, count, acked):
    store, port = tempfile.mkdtemp(), free_port()
    server = start(port, store)
    nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
    await nc.jetstream().add_stream(name="EGRESS", subjects=["egress.>"])
    if acked:
        js = nc.jetstream()
        # All in flight at once, as loopguard's workers have them.
        await asyncio.gather(
            *(js.publish(f"egress.{i % 7}", b"x" * 300) for i in range(count))
        )  # the stream has answered every message
    else:
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
    acked = len(sys.argv) > 4 and sys.argv[4] == "acked"
    sig = signal.SIGKILL if how == "kill" else signal.SIGTERM
    held = [await round_trip(sig, count, acked) for _ in range(rounds)]
    lost = sum(count - h for h in held)
    after = "the last answer" if acked else "the flush"
    print(f"SIG{sig.name[3:]} right after {after}: the stream held {held} of {count} each;")
    print(f"lost {lost} of {rounds * count} ({100 * lost / (rounds * count):.1f}%)")


asyncio.run(main())
