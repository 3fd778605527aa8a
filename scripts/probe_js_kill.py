#!/usr/bin/env python3
"""What does a SIGKILL of nats-server mid-burst leave a work-queue consumer?

Seen in the reliability suite (docs/operations.md, "A SIGKILL of
nats-server mid-burst"): after such a kill, nats-server 2.9.10 sometimes
delivered nothing more to loopguard's consumer, with messages waiting in the
stream. This probe asks why, without loopguard: a work-queue stream and a
durable pull consumer like loopguard's, a publisher and a consumer that
acknowledges everything it is given, the server killed mid-burst and started
again on the same store. After the restart it records the stream's and the
consumer's state, publishes more, pulls until nothing comes, and counts what
is left in the stream: a healthy consumer leaves nothing.

    python3 scripts/probe_js_kill.py [rounds] [messages]

Not part of `make test`.
"""
import asyncio
import os
import signal
import sys
import tempfile

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from nats_probe import free_port, start


async def state(js):
    s = (await js.stream_info("ING")).state
    c = await js.consumer_info("ING", "c")
    return {
        "stream": (s.first_seq, s.last_seq, s.messages),
        "delivered": c.delivered.stream_seq,
        "floor": c.ack_floor.stream_seq,
        "pending": c.num_pending,
        "ack_pending": c.num_ack_pending,
    }


async def consume(sub, stop=None, wait=0.2):
    """Acknowledges all it is given: until `stop` is set, or else until
    nothing comes for `wait` seconds."""
    taken = 0
    while stop is None or not stop.is_set():
        try:
            batch = await sub.fetch(100, timeout=wait)
        except Exception:
            if stop is None:
                break
            continue
        for m in batch:
            await m.ack()
            taken += 1
    return taken


async def round_trip(count):
    store, port = tempfile.mkdtemp(), free_port()
    server = start(port, store)
    nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name="ING", subjects=["raw.>"], retention=RetentionPolicy.WORK_QUEUE)
    )
    config = ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=2)
    await js.add_consumer("ING", config)
    sub = await js.pull_subscribe_bind("c", stream="ING")
    stop = asyncio.Event()
    consumer = asyncio.create_task(consume(sub, stop))
    for i in range(count // 2):
        await js.publish(f"raw.{i % 7}", b"x" * 200)
    # The second half in flight at once, and the kill while it lands.
    burst = [asyncio.create_task(js.publish(f"raw.{i % 7}", b"x" * 200)) for i in range(count // 2)]
    await asyncio.sleep(0.05)
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    stop.set()
    # The old connection cannot reconnect: wait for what it had in flight
    # to fail, but not forever.
    await asyncio.wait([consumer, *burst], timeout=10)
    try:
        await asyncio.wait_for(nc.close(), 5)
    except Exception:
        pass

    server = start(port, store)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    for _ in range(50):
        try:
            after = await state(js)
            break
        except Exception:
            await asyncio.sleep(0.1)
    for i in range(200):
        await js.publish(f"raw.{i % 7}", b"y" * 200)
    sub = await js.pull_subscribe_bind("c", stream="ING")
    taken = await consume(sub, wait=1.0)
    await asyncio.sleep(0.2)
    end = await state(js)
    await nc.close()
    server.kill()
    server.wait()
    return after, taken, end


async def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    stuck_rounds = 0
    for r in range(rounds):
        after, taken, end = await round_trip(count)
        # What awaits its redelivery (`ack_pending`) will come; the rest
        # no pull delivers.
        left = end["stream"][2] - end["ack_pending"]
        stuck_rounds += left > 0
        ahead = after["delivered"] > after["stream"][1]
        print(
            f"round {r}: after restart {after} ahead={ahead}; "
            f"pulled {taken} after 200 more; left undeliverable {left}; end {end}",
            flush=True,
        )
    print(f"{stuck_rounds} of {rounds} rounds left messages no pull delivers")


asyncio.run(main())
