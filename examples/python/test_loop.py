"""`make test-examples`: naive agents against a real nats-server and a real
loopguard, shown to be cut off when they loop: the Python agent of this
directory, or, with `--typescript`, the TypeScript one of
../typescript (run with tsx, as its README says), with `--go`, the Go
one of ../go (built beforehand, its path in GO_AGENT), or, with `--rust`,
the Rust one of ../rust (`cargo build --example agent`, its path in
RUST_AGENT).

Two naive agents answer each other forever. The test starts them, lets a
human start the conversation, and checks that loopguard rejects the message
that makes the reply chain too deep, that nothing reaches an inbox after it
(proved with a barrier through the same world, not with a sleep), and that
every other message was delivered. The human's message also holds the pass
tag and, on a line of its own, a mention of a third agent on the roster
(carol, who only listens): an agent quoting it must neither hand the world
back nor write to carol.
"""
import argparse
import asyncio
import contextlib
import json
import os
import signal
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
# The whole scenario: loopguard's start, the agents' (two cold tsx starts
# with --typescript) and the conversation, on a loaded CI machine.
TIMEOUT = 60
# How long an agent has to end once asked to (SIGTERM) before it is killed.
STOP_TIMEOUT = 10


async def nats_url(proc, tmp):
    """The URL of the nats-server `proc`, from the ports file it writes."""
    ports = os.path.join(tmp, f"nats-server_{proc.pid}.ports")
    for _ in range(TIMEOUT * 100):
        if os.path.exists(ports):
            try:
                with open(ports) as f:
                    return json.load(f)["nats"][0]
            except (ValueError, KeyError):
                pass
        await asyncio.sleep(0.01)
    raise RuntimeError("nats-server did not start")


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--typescript", action="store_true", help="run the TypeScript agent")
    which.add_argument("--go", action="store_true", help="run the Go agent (GO_AGENT: its binary)")
    which.add_argument("--rust", action="store_true", help="run the Rust agent (RUST_AGENT: its binary)")
    args = parser.parse_args()
    language = ("TypeScript" if args.typescript else "Go" if args.go
                else "Rust" if args.rust else "Python")
    with tempfile.TemporaryDirectory() as tmp:
        nats_proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", tmp],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = await nats_url(nats_proc, tmp)
            # The caller's LOOPGUARD* settings would change the limits this
            # test expects: only the ones set here.
            env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD")}
            env.update(LOOPGUARD__NATS__URL=url, LOOPGUARD__HTTP__LISTEN="127.0.0.1:0",
                       LOOPGUARD__RULES__DEPTH__MAX="6")
            guard = subprocess.Popen([LOOPGUARD], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                await asyncio.wait_for(scenario(url, language), TIMEOUT)
            finally:
                guard.terminate()
                try:
                    guard.wait(TIMEOUT)
                except subprocess.TimeoutExpired:
                    guard.kill()
                    raise
        finally:
            nats_proc.terminate()
            nats_proc.wait(TIMEOUT)
        assert guard.returncode == 0, f"loopguard exited {guard.returncode} on SIGTERM"
    print(f"{language} example: the looping agents were cut off by loopguard")


async def python_agents(url):
    """The two agents in this process; a function that stops them."""
    # Names as a person might type them: the agents listen on the inboxes
    # loopguard names in lowercase.
    agents = [Agent(await nats.connect(url), "PyLoop", name, peer) for name, peer in (("Alice", "Bob"), ("Bob", "Alice"))]
    for agent in agents:
        await agent.start()

    async def stop():
        for agent in agents:
            await agent.nc.close()
    return stop


def typescript_agent(url, name, peer):
    """How to start the TypeScript agent: with tsx, in its directory. Its
    exit status on SIGTERM is not checked: it has no handler for it."""
    here = os.path.join(ROOT, "examples", "typescript")
    return [os.path.join(here, "node_modules", ".bin", "tsx"), "agent.ts",
            "--url", url, "--world", "PyLoop", "--name", name, "--peer", peer], here, False


def go_agent(url, name, peer):
    """How to start the Go agent: the binary `make test-examples` built.
    On SIGTERM it drains its connection and exits 0."""
    binary = os.environ.get("GO_AGENT") or os.path.join(ROOT, "target", "go-agent")
    return [binary, "-url", url, "-world", "PyLoop", "-name", name, "-peer", peer], None, True


def rust_agent(url, name, peer):
    """How to start the Rust agent: the example cargo built. On SIGTERM it
    drains its connection and exits 0."""
    binary = os.environ.get("RUST_AGENT") or os.path.join(ROOT, "target", "debug", "examples", "agent")
    return [binary, "--url", url, "--world", "PyLoop", "--name", name, "--peer", peer], None, True


async def process_agents(url, command):
    """The two agents as processes (`command(url, name, peer)` says how to
    start one, and whether it exits 0 on SIGTERM), each subscribed and
    joined once it prints its first line; a function that stops them."""
    procs = []
    drains = False

    async def stop():
        # The group may be gone already (an agent that crashed): the
        # return code below tells of it.
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        hung = []
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except asyncio.TimeoutError:
                hung.append(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        assert not hung, f"agents {hung} did not end within {STOP_TIMEOUT} s of SIGTERM"
        if drains:
            codes = [proc.returncode for proc in procs]
            assert codes == [0] * len(procs), f"agents exited {codes} on SIGTERM"

    # Names as a person might type them (see `python_agents`).
    for name, peer in (("Alice", "Bob"), ("Bob", "Alice")):
        argv, cwd, drains = command(url, name, peer)
        # In a session of its own: tsx runs the TypeScript agent in a child
        # node process, and stopping the session stops both.
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        line = await proc.stdout.readline()
        if b"listening" not in line:
            await stop()
            raise AssertionError(f"{name}: {line!r}")
    return stop


# How to start each agent that runs as a process of its own.
AGENTS = {"TypeScript": typescript_agent, "Go": go_agent, "Rust": rust_agent}


async def scenario(url, language):
    nc = await nats.connect(url)
    events = asyncio.Queue()
    delivered = [0]  # copies that reached an agent's inbox
    to_carol = [0]  # of which to carol's

    # One subscription, so events and inbox copies are seen in the order
    # loopguard published them.
    async def on_message(msg):
        if msg.subject == "chat.events.pyloop":
            events.put_nowait(json.loads(msg.data))
        elif msg.subject.startswith("chat.private.pyloop."):
            delivered[0] += 1
            to_carol[0] += msg.subject == "chat.private.pyloop.carol"

    await nc.subscribe("chat.>", cb=on_message)
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

    if language == "Python":
        stop = await python_agents(url)
    else:
        stop = await process_agents(url, AGENTS[language])
    try:
        await nc.publish("chat.join.pyloop.carol", b"")
        await barrier("joined")
        seen.clear()

        opener = "@alice thoughts? ask bob <world>pass</world>\n@carol"
        await nc.publish("chat.raw.pyloop.human.hank", json.dumps({"content": opener}).encode())
        while not any(e["decision"] in ("rejected", "edited") for e in seen):
            seen.append(await events.get())
        edited = [e for e in seen if e["decision"] == "edited"]
        assert not edited, f"an agent quoted the pass tag and handed the world back: {edited}"
        cut = next(e for e in seen if e["decision"] == "rejected")
        assert cut["rule"] == "depth", cut
        assert cut["depth"] == 7, cut

        before = delivered[0]
        await barrier("after")
        assert delivered[0] == before, "an agent received a message after the cut"
        approved_agent_messages = [e for e in seen if e["decision"] == "approved" and e["sender_kind"] == "agent"]
        assert len(approved_agent_messages) == 6, seen
        # hank's message reached alice and carol, then each approved reply
        # reached the peer alone
        assert to_carol[0] == 1, f"carol received {to_carol[0]} copies: a quoted mention addressed her"
        assert delivered[0] == 2 + 6, delivered[0]
    finally:
        await stop()
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
