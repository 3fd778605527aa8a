// A naive agent in TypeScript (nats.js), behind loopguard.
//
// It reads its inbox and answers its peer, forever; loopguard stops the loop
// at the bus. The only loopguard-specific lines are the subjects:
//   publish to   chat.raw.<world>.agent.<name>   (its raw output)
//   read from    chat.private.<world>.<name>     (what it should act on)
//   announce on  chat.join.<world>.<name>        (puts it on the roster)
// (`chat` is loopguard's `nats.prefix`: `--prefix` when it runs with another.)
//
//   npm install && npx tsx agent.ts --world demo --name alice --peer bob
import { connect, Events, JSONCodec } from "nats";

// loopguard forgets an agent that only listens after `state.idle_seconds`
// (an hour by default), and all of its roster on a restart: the agent joins
// again this often, and whenever its connection comes back.
const JOIN_EVERY_MS = 10 * 60 * 1000;

interface Message {
  id: string;
  content: string;
  sender: string;
  sender_kind: "agent" | "human" | "system";
  thread_id: string;
  depth: number;
  visibility: "public" | "private";
}

function arg(name: string, fallback?: string): string {
  const i = process.argv.indexOf(`--${name}`);
  const value = i >= 0 ? process.argv[i + 1] : fallback;
  if (value === undefined) throw new Error(`--${name} is required`);
  return value;
}

// A world or agent name as loopguard reads it (contract §1): it lowercases
// the token, which must then be 1-64 of a-z, 0-9, _ and -. Inboxes are
// named in that form, and NATS subjects are case-sensitive, so an agent
// started as "Alice" would listen on an inbox loopguard never writes to.
function canonical(flag: string, name: string): string {
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(name)) {
    throw new Error(`--${flag} ${JSON.stringify(name)}: a name is 1-64 of a-z, 0-9, '_' and '-'`);
  }
  return name.toLowerCase();
}

async function main(): Promise<void> {
  const url = arg("url", "nats://127.0.0.1:4222");
  const world = canonical("world", arg("world", "demo"));
  const name = canonical("name", arg("name"));
  const peer = canonical("peer", arg("peer"));
  const prefix = arg("prefix", "chat");

  const nc = await connect({ servers: url });
  const json = JSONCodec<Message | { content: string; parent_id: string }>();
  const raw = `${prefix}.raw.${world}.agent.${name}`;
  const join = `${prefix}.join.${world}.${name}`;
  const inbox = nc.subscribe(`${prefix}.private.${world}.${name}`);
  nc.publish(join);
  // The server holds the subscription and has the join once this returns.
  await nc.flush();
  const rejoin = setInterval(() => {
    if (!nc.isClosed()) nc.publish(join);
  }, JOIN_EVERY_MS);
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === Events.Reconnect) nc.publish(join);
    }
  })();
  console.log(`${name}: listening on ${inbox.getSubject()}, publishing to ${raw}`);

  let n = 0;
  for await (const m of inbox) {
    const message = json.decode(m.data) as Message;
    n += 1;
    // The first 60 characters, not UTF-16 units: a cut through an emoji's
    // surrogate pair would send invalid JSON (loopguard takes that as text).
    const quoted = Array.from(message.content).slice(0, 60).join("");
    nc.publish(raw, json.encode({
      content: `@${peer} ${name} replies (#${n}) to: ${quoted}`,
      parent_id: message.id,
    }));
  }
  // The connection closed: nothing more to join.
  clearInterval(rejoin);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
