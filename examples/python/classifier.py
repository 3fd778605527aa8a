"""A policy service for loopguard's policy hook, in Python (nats-py).

loopguard asks it about every agent message its own rules approved, with a
NATS request on `rules.policy.subject` carrying the message as it would be
delivered (JSON: content, sender, world, depth, ...). It must answer
{"decision": "approve"} or {"decision": "reject", "reason": "..."} within
`rules.policy.timeout_ms`; otherwise loopguard fails open or closed as
configured.

This one is a stand-in for an LLM classifier: it rejects boilerplate that
keeps agent loops going (apologies, "as an AI", self-referential filler).
Run several instances: they share the work through a queue group.

    python classifier.py --url nats://127.0.0.1:4222 --subject loopguard.policy
    # loopguard: [rules.policy] subject = "loopguard.policy"
"""
import argparse
import asyncio
import json
import re

import nats

FILLER = [
    r"\bas an ai\b",
    r"\bi apologi[sz]e for (the|any) confusion\b",
    r"\bi hope this helps\b",
    r"\blet me know if you (need|have) anything else\b",
    r"\bgreat question\b",
]


def judge(message):
    """The decision for one message (a dict of loopguard's egress JSON)."""
    content = (message.get("content") or "").lower()
    for pattern in FILLER:
        if re.search(pattern, content):
            return {"decision": "reject", "reason": f"filler that keeps loops going ({pattern})"}
    return {"decision": "approve"}


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--subject", default="loopguard.policy")
    args = parser.parse_args()
    # Reconnects for ever (nats-py gives up after 60 tries by default: a
    # deaf policy service times out every question); that would retry the
    # first connection for ever too, so a wrong --url fails after 30 s.
    try:
        nc = await asyncio.wait_for(nats.connect(args.url, max_reconnect_attempts=-1), 30)
    except asyncio.TimeoutError:
        raise SystemExit(f"cannot connect to {args.url} within 30 s")

    async def answer(msg):
        try:
            decision = judge(json.loads(msg.data))
        except ValueError:
            decision = {"decision": "approve"}  # not ours to judge
        await msg.respond(json.dumps(decision).encode())

    await nc.subscribe(args.subject, queue="loopguard-policy", cb=answer)
    print(f"policy service on {args.subject}")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
