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
# again this often, and whenever its connection comes back.
JOIN_EVERY_SECONDS = 600

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
        message = json.loads(msg.data)
        self.received += 1
        reply = {
            # A different text each time, so only the loop rules can stop it.
            "content": f"@{self.peer} {self.name} replies (#{self.received}) to: {message['content'][:60]}",
            "parent_id": message["id"],
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
    agent = None

    async def rejoin():
        if agent is not None:
            await agent.rejoin()

    nc = await nats.connect(args.url, reconnected_cb=rejoin)
    agent = Agent(nc, args.world, args.name, args.peer, args.prefix)
    await agent.start()
    print(f"{agent.name}: listening on {agent.inbox}, publishing to {agent.raw}")
    await agent.keep_joined()


if __name__ == "__main__":
    asyncio.run(main())
