#!/usr/bin/env python3
"""JetStream mode's cost with `nats.jetstream.egress_acks` on and off.

Loads N messages into loopguard's ingest stream while loopguard is stopped,
then starts it and times the drain: until its consumer has acknowledged
every message. Prints messages a second and loopguard's CPU a message (from
/proc), with a stream that captures the transcript and the inboxes (whose
copies egress_acks then sends as JetStream publishes) and without one
(where egress_acks changes nothing). Not part of `make test`; see
docs/operations.md, "A NATS restart and the egress stream".

    python3 scripts/probe_js_rate.py target/release/loopguard [messages] [rounds]
"""
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import nats

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])

CONFIG = """mode = "enforce"
[nats.jetstream]
enabled = true
egress_acks = {acks}
[events]
approved = false
[rules.turns]
max = 0
[rules.depth]
max = 0
[rules.duplicate]
window_seconds = 0
[rules.rate]
max = 0
[http]
listen = "127.0.0.1:0"
"""

async def run(bin_, n, acks, egress):
    store, port = tempfile.mkdtemp(), free_port()
    server = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    url = f"nats://127.0.0.1:{port}"
    nc = await nats.connect(url)
    js = nc.jetstream()
    if egress:
        await js.add_stream(name="EGRESS", subjects=["chat.public.>", "chat.private.>"], duplicate_window=120)
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(CONFIG.format(acks=str(acks).lower())); cfg.close()
    env = dict(os.environ, LOOPGUARD__NATS__URL=url)
    def spawn():
        return subprocess.Popen([bin_, "--config", cfg.name], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lg = spawn()
    for _ in range(100):
        try:
            await js.consumer_info("LOOPGUARD_INGEST", "loopguard"); break
        except Exception:
            await asyncio.sleep(0.1)
    lg.kill(); lg.wait()
    # 100 worlds, 4 agents each; every fifth message a human's, no mention:
    # public and to every other roster agent's inbox.
    futs = []
    for i in range(n):
        w = i % 100
        if (i // 100) % 5 == 4:
            subj = f"chat.raw.w{w}.human.h"
        else:
            subj = f"chat.raw.w{w}.agent.a{(i // 100) % 4}"
        body = json.dumps({"content": f"message {i} " + "x" * 180, "id": f"m{i}"}).encode()
        futs.append(js.publish(subj, body))
        if len(futs) == 1000:
            await asyncio.gather(*futs); futs = []
    await asyncio.gather(*futs)
    lg = spawn()
    t0 = time.monotonic(); c0 = None
    while True:
        if c0 is None:
            try: c0 = cpu_ticks(lg.pid)
            except Exception: pass
        info = await js.consumer_info("LOOPGUARD_INGEST", "loopguard")
        if info.num_pending == 0 and info.num_ack_pending == 0:
            break
        await asyncio.sleep(0.02)
    elapsed = time.monotonic() - t0
    c1 = cpu_ticks(lg.pid)
    held = (await js.stream_info("EGRESS")).state.messages if egress else None
    lg.terminate(); lg.wait()
    await nc.close()
    server.kill(); server.wait()
    tick = os.sysconf("SC_CLK_TCK")
    return n / elapsed, (c1 - (c0 or 0)) / tick / n * 1e6, held

async def main():
    bin_ = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 50000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    for r in range(rounds):
        for egress in (True, False):
            for acks in (False, True):
                rate, cpu, held = await run(bin_, n, acks, egress)
                print(f"round {r+1} egress stream {'yes' if egress else 'no '} egress_acks {str(acks):5}: "
                      f"{rate:8.0f} msg/s, loopguard CPU {cpu:6.2f} µs/msg" + (f", egress held {held}" if held is not None else ""), flush=True)

asyncio.run(main())
