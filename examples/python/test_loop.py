"""`make test-examples`: the Python agent against a real nats-server and a
real loopguard, shown to be cut off when it loops.

Two naive agents answer each other forever. The test starts them, lets a
human start the conversation, and checks that loopguard rejects the message
that makes the reply chain too deep, that nothing reaches an inbox after it
(proved with a barrier through the same world, not with a sleep), and that
every other message was delivered.
"""
import asyncio
import json
import os
import subprocess
import sys
import tempfile

import nats

from agent import Agent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOPGUARD = os.environ.get("LOOPGUARD_BIN", os.path.join(ROOT, "target", "debug", "loopguard"))
NATS_SERVER = os.environ.get("NATS_SERVER") or next(
    (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.path.exists(p)), "nats-server"
)
TIMEOUT = 15


async def start_nats(tmp):
    proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = os.path.join(tmp, f"nats-server_{proc.pid}.ports")
    for _ in range(500):
        if os.path.exists(ports):
            try:
                return proc, json.load(open(ports))["nats"][0]
            except (ValueError, KeyError):
                pass
        await asyncio.sleep(0.01)
    raise RuntimeError("nats-server did not start")


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        nats_proc, url = await start_nats(tmp)
        env = dict(os.environ, LOOPGUARD__NATS__URL=url, LOOPGUARD__HTTP__LISTEN="127.0.0.1:0",
                   LOOPGUARD__RULES__DEPTH__MAX="6")
        guard = subprocess.Popen([LOOPGUARD], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await asyncio.wait_for(scenario(url), TIMEOUT)
        finally:
            guard.terminate()
            guard.wait(TIMEOUT)
            nats_proc.terminate()
            nats_proc.wait(TIMEOUT)
        assert guard.returncode == 0, f"loopguard exited {guard.returncode} on SIGTERM"
    print("python example: the looping agents were cut off by loopguard")


async def scenario(url):
    nc = await nats.connect(url)
    events = asyncio.Queue()

    async def on_event(msg):
        events.put_nowait(json.loads(msg.data))

    await nc.subscribe("chat.events.pyloop", cb=on_event)
    await nc.flush()

    # loopguard is up once a barrier comes back through it. loopguard reads
    # raw messages and joins on two subscriptions, ordered only among
    # themselves, so the barrier goes through both: an invalid raw subject
    # and an invalid join subject, each rejected with the token as sender.
    async def barrier(token):
        await nc.publish(f"chat.raw.pyloop.sync.{token}", b"")
        await nc.publish(f"chat.join.pyloop.{token}j.sync", b"")
        pending = {token, token + "j"}
        while pending:
            e = await events.get()
            if e["sender"] in pending:
                pending.discard(e["sender"])
            else:
                seen.append(e)

    seen = []
    while True:
        try:
            await asyncio.wait_for(barrier("ready"), 0.3)
            break
        except asyncio.TimeoutError:
            pass
    seen.clear()

    alice = Agent(await nats.connect(url), "pyloop", "alice", "bob")
    bob = Agent(await nats.connect(url), "pyloop", "bob", "alice")
    await alice.start()
    await bob.start()
    await barrier("joined")
    seen.clear()

    await nc.publish("chat.raw.pyloop.human.hank", json.dumps({"content": "@alice what do you think? ask bob"}).encode())
    while not any(e["decision"] == "rejected" for e in seen):
        seen.append(await events.get())
    cut = next(e for e in seen if e["decision"] == "rejected")
    assert cut["rule"] == "depth", cut
    assert cut["depth"] == 7, cut

    before = alice.received + bob.received
    await barrier("after")
    assert alice.received + bob.received == before, "an agent received a message after the cut"
    approved_agent_messages = [e for e in seen if e["decision"] == "approved" and e["sender_kind"] == "agent"]
    assert len(approved_agent_messages) == 6, seen
    # hank's message reached alice, then each approved reply reached the peer
    assert alice.received + bob.received == 1 + 6, (alice.received, bob.received)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
