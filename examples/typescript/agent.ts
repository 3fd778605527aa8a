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
// again this often (keep it below `state.idle_seconds`), and whenever its
// connection comes back.
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

// loopguard's `nats.prefix`: one or more dot-separated tokens of the same
// characters (a `*`, `>` or space would make a wildcard or bad subject).
function prefixOf(prefix: string): string {
  if (!/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/.test(prefix)) {
    throw new Error(`--prefix ${JSON.stringify(prefix)}: dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'`);
  }
  return prefix;
}

// The first 60 characters of `text` (not UTF-16 units: a cut through an
// emoji's surrogate pair would send invalid JSON), on one line and without
// the pass tag: quoted as they came, a newline then `@carol` would address
// the reply to carol too, and a quoted tag would make it a hand-back.
function quote(text: string): string {
  let line = text.split(/\s+/).filter((w) => w !== "").join(" ");
  for (;;) {
    const cut = line.replace(/<world>pass<\/world>/gi, "");
    if (cut === line) break;
    line = cut;
  }
  return Array.from(line).slice(0, 60).join("");
}

async function main(): Promise<void> {
  const url = arg("url", "nats://127.0.0.1:4222");
  const world = canonical("world", arg("world", "demo"));
  const name = canonical("name", arg("name"));
  const peer = canonical("peer", arg("peer"));
  const prefix = prefixOf(arg("prefix", "chat"));

  // Reconnects for ever (nats.js gives up after 10 tries by default).
  const nc = await connect({ servers: url, maxReconnectAttempts: -1 });
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
    let message: Message;
    try {
      message = json.decode(m.data) as Message;
      if (typeof message.content !== "string" || typeof message.id !== "string") throw new Error("no content or id");
    } catch (err) {
      console.error(`${name}: not a loopguard message on ${m.subject}: ${err}`);
      continue;
    }
    n += 1;
    nc.publish(raw, json.encode({
      content: `@${peer} ${name} replies (#${n}) to: ${quote(message.content)}`,
      parent_id: message.id,
    }));
  }
  // The connection closed for good (it reconnects otherwise): an agent
  // that cannot hear fails, so a supervisor restarts it.
  clearInterval(rejoin);
  const err = await nc.closed();
  throw new Error(`connection closed${err ? `: ${err.message}` : ""}`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
