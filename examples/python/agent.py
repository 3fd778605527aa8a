"""A naive agent in Python (nats-py), behind loopguard.

It does what agents on every framework do: read its inbox, answer its peer,
forever. Nothing in it knows about loops; loopguard stops them at the bus.
The only loopguard-specific lines are the subjects:

    publish to   chat.raw.<world>.agent.<name>     (its raw output)
    read from    chat.private.<world>.<name>       (what it should act on)
    announce on  chat.join.<world>.<name>          (puts it on the roster)

(`chat` is loopguard's `nats.prefix`: `--prefix` when it runs with another.)

Run two of them against a NATS server with loopguard in front:

    python agent.py --world demo --name alice --peer bob &
    python agent.py --world demo --name bob --peer alice &
    # a human starts it; with the nats CLI (any NATS client will do):
    nats pub chat.raw.demo.human.hank '{"content": "@alice what do you think? ask bob"}'
"""
import argparse
import asyncio
import json
import re

import nats

# loopguard forgets an agent that only listens after `state.idle_seconds`
# (an hour by default), and all of its roster on a restart: the agent joins
# again this often (keep it below `state.idle_seconds`), and whenever its
# connection comes back.
JOIN_EVERY_SECONDS = 600

# How long the first connection may take before the agent gives up.
CONNECT_SECONDS = 30

# A world or agent name as loopguard reads it (contract §1): it lowercases
# the token, which must then be 1-64 of a-z, 0-9, _ and -. Inboxes are
# named in that form, and NATS subjects are case-sensitive, so an agent
# started as "Alice" would listen on an inbox loopguard never writes to.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def canonical(name):
    """`name` as loopguard names it, or an error saying why it is none."""
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r}: a name is 1-64 of a-z, 0-9, '_' and '-'")
    return name.lower()


# loopguard's `nats.prefix`: one or more dot-separated tokens of the same
# characters (a `*`, `>` or space would make a wildcard or bad subject).
PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")

# loopguard hands the world back to a human for this text, in any case.
PASS = re.compile(r"<world>pass</world>", re.IGNORECASE)


def quote(text):
    """The first 60 characters of `text`, on one line and without the pass
    tag: quoted as they came, a newline then `@carol` would address the
    reply to carol too, and a quoted tag would make it a hand-back."""
    text = " ".join(text.split())
    while PASS.search(text):
        text = PASS.sub("", text)
    return text[:60]


class Agent:
    """Answers every inbox message by mentioning its peer."""

    def __init__(self, nc, world, name, peer, prefix="chat"):
        world, name, peer = canonical(world), canonical(name), canonical(peer)
        self.nc = nc
        self.name = name
        self.peer = peer
        self.raw = f"{prefix}.raw.{world}.agent.{name}"
        self.inbox = f"{prefix}.private.{world}.{name}"
        self.join = f"{prefix}.join.{world}.{name}"
        self.received = 0

    async def start(self):
        await self.nc.subscribe(self.inbox, cb=self.on_message)
        await self.announce()

    async def announce(self):
        """Puts the agent on the world's roster (the server has the join
        once this returns)."""
        await self.nc.publish(self.join, b"")
        await self.nc.flush()

    async def keep_joined(self):
        while True:
            await asyncio.sleep(JOIN_EVERY_SECONDS)
            await self.rejoin()

    async def rejoin(self):
        """`announce`, where the connection may be down: the next round
        (or the reconnect) tries again, and the agent goes on."""
        try:
            await self.announce()
        except nats.errors.Error as e:
            print(f"{self.name}: could not join again ({e!r}); trying later")

    async def on_message(self, msg):
        try:
            message = json.loads(msg.data)
            content, parent = message["content"], message["id"]
        except (ValueError, TypeError, KeyError) as e:
            print(f"{self.name}: not a loopguard message on {msg.subject}: {e!r}")
            return
        self.received += 1
        reply = {
            # A different text each time, so only the loop rules can stop it.
            "content": f"@{self.peer} {self.name} replies (#{self.received}) to: {quote(content)}",
            "parent_id": parent,
        }
        await self.nc.publish(self.raw, json.dumps(reply).encode())


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--world", default="demo")
    parser.add_argument("--name", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--prefix", default="chat", help="loopguard's nats.prefix")
    args = parser.parse_args()
    for name in (args.world, args.name, args.peer):
        try:
            canonical(name)
        except ValueError as e:
            parser.error(str(e))
    if not PREFIX.fullmatch(args.prefix):
        parser.error(f"--prefix {args.prefix!r}: dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'")
    agent = None

    async def rejoin():
        if agent is not None:
            await agent.rejoin()

    # Reconnects for ever (nats-py gives up after 60 tries by default, and
    # the agent would go on deaf); that would retry the first connection
    # for ever too, so a wrong --url fails after CONNECT_SECONDS.
    try:
        nc = await asyncio.wait_for(
            nats.connect(args.url, reconnected_cb=rejoin, max_reconnect_attempts=-1), CONNECT_SECONDS)
    except asyncio.TimeoutError:
        raise SystemExit(f"cannot connect to {args.url} within {CONNECT_SECONDS} s")
    agent = Agent(nc, args.world, args.name, args.peer, args.prefix)
    await agent.start()
    print(f"{agent.name}: listening on {agent.inbox}, publishing to {agent.raw}")
    await agent.keep_joined()


if __name__ == "__main__":
    asyncio.run(main())
