#!/usr/bin/env bash
# Writes docs/benchmarks.md from the outputs of `make bench`.
set -euo pipefail
relay=$1 decision=$2 memory=$3 flood=$4 policy=$5
cat <<HEAD
# Benchmarks

Kept by \`make bench\` (last run below). Compare ratios inside one run, never
absolute numbers across runs or machines: the server, the producer, the
consumer and the relay share the same CPUs. Run to run, absolute rates here
moved by about ±20%; ratios by less. The rate search grows by 25% a step
until a rate fails, then halves the gap to the last pass twice, so "max
sustained" is within about 6% of the limit of that run. A rate that fails
once is not sustained (since 2026-11-23; before, a failed step was run
once more and a pass the second time counted, which flattered every
set-up, loopguard's (c1) of 08:54 UTC among them).

HEAD
sed 's/| -0 |/| 0 |/' "$relay"
cat <<'NOTES'

### Reading the relay table

These notes are kept by hand. The figures they quote are from the runs
they name (most of them: the relay run of 2026-11-22 15:06 UTC and the
criterion run of 15:07 UTC, of commit 415da51; the first point gives the
latest, of 2026-11-23 19:04 UTC, the second those of 17:06 UTC, the third
those of 13:40 UTC, the fourth those of 09:56 UTC, the fifth those of
08:54 UTC, the sixth those of 07:32 UTC, the seventh those of 06:50 UTC,
the eighth those of 04:48 UTC, the ninth those of 02:56 UTC, the tenth
those of 01:39 UTC, the eleventh those of 00:12 UTC, the twelfth those of
2026-11-22 21:57 UTC, the thirteenth those of 19:20 UTC, the fourteenth
those of 17:08 and 17:09 UTC),
which need not be the run printed above: where the two differ, the tables
are the newer.

- **A calmer stretch (2026-11-23 19:04 UTC, commit fb5d1e5).** The run
  printed above. Since the 17:06 UTC run (figures in brackets) the
  decision path is the same; the client counts what it drops for a full
  subscription (an atomic add on that path only), and in JetStream mode
  the consumer's counts are read every 10 s. The server alone, (a),
  sustained 618k msg/s [724k], the bare relay 372k [226k] at 1.97 µs of
  its CPU a message [2.82]. (c1)/(b) rate 0.41 [0.49], (c2)/(b) 0.29
  [0.37]; in msg/s (c1) 152k [110k], (c2) 110k [83k]; ceilings (a2)/(b)
  0.51 [0.76], (b2)/(b) 0.51 [0.54]. CPU in the table (c1)/(b) 5.28
  [3.17], (b2)/(b) 2.47 [1.17]; side by side (c1)/(b) median 4.74
  [4.42], (b2)/(b) 1.56 [1.66], (c1)/(b2) 3.04 [2.64]. Criterion 3.03 /
  3.36 / 5.59 µs [3.45 / 3.87 / 7.71]; samples' medians 2.73 / 3.20 µs
  [3.16 / 3.53], slowest 4.79 / 5.89; single decisions p99 6.93 µs
  [7.45], 4.58 with the upkeep between [4.87]; busy worlds p50 3.82
  [5.60], p99 8.27 [12.16]. Mentions 91 ns to scan [94]. Idle world 918
  bytes [918]; the flood levelled off at 103.0-107.4 MiB [102.9-110.2].
  Policy hook (p1)/(p0) 0.51 [0.43], (p2)/(p0) 0.13 [0.18]. 0 drops.

- **The same decision path again (2026-11-23 17:06 UTC, commit 57fc0f4).**
  Nothing on a message's path changed since the
  13:40 UTC run (figures in brackets): that session's changes were to
  start-up, reloads and the example agents. Another slow stretch, of
  another shape: the server alone, (a), sustained 724k msg/s [419k], the
  bare relay 226k [298k] at 2.82 µs of its CPU a message.
  (c1)/(b) rate 0.49 [0.41], (c2)/(b) 0.37 [0.26]; in msg/s (c1) 110k
  [122k], (c2) 83k [78k]; ceilings (a2)/(b) 0.76 [0.51], (b2)/(b) 0.54
  [0.51]. CPU in the table (c1)/(b) 3.17 [3.95], (b2)/(b) 1.17 [1.53];
  side by side (c1)/(b) median 4.42 [4.57], (b2)/(b) 1.66 [1.54],
  (c1)/(b2) 2.64 [2.97]. Criterion 3.45 / 3.87 / 7.71 µs [3.05 / 3.41 /
  5.96], samples' medians 3.16 / 3.53 µs [2.85 / 3.16]; single decisions
  p99 7.45 µs [7.26], 4.87 with the upkeep between [5.35]; busy worlds
  p50 5.60 [5.23], p99 12.16 [11.58]. Mentions 94 ns to scan [97]. Idle
  world 918 bytes [918]; the flood levelled off at 102.9-110.2 MiB
  [103.1-110.5]. Policy hook (p1)/(p0) 0.43 [0.42], (p2)/(p0) 0.18
  [0.12]. 0 drops. The same code, half a day apart: how far these moved
  is the machine's doing, and the reason to read ratios only within a run.

- **Fewer allocations a decision (2026-11-23 13:40 UTC, commit 681842b).**
  The run printed above, on a fresh machine, in a slow stretch: the
  server alone, (a), sustained 419k msg/s, against 727k at 09:56 UTC
  (figures in brackets), and the bare relay 298k [369k]. Since that run a
  decision allocates less, and is a little faster in process, but not
  measurably in the relay:
  - *Allocations*, counted by a counting allocator over 10,000 decisions
    in 1,000 worlds (2026-11-23, 12:00-12:40 UTC): an agent's decision
    13.5 before, 9.5 after; a human's broadcast to four agents 23 and 18
    (four more each with approved events on). Gone: the list of
    paragraph-start mentions, a copy of the mention list, a
    `private.<agent>` string per inbox for the event, and the copy of the
    content (borrowed from the payload when written without escapes).
  - *In process* (criterion, `DECISION_WORLDS=100000`, plain release
    builds of that session's first and last commits run in turn): events
    off 3.23, 2.93, 3.01 µs before and 2.83, 2.75, 2.81 after; events on
    (before the content was borrowed) 3.73, 3.86 against 3.34, 3.46.
  - *In the relay* (`BENCH_ONLY=pair`, the same two builds, not
    profile-guided, run in turn three times each): (c1)/(b2) medians
    2.93, 3.22, 3.29 before and 3.03, 3.31, 3.17 after; (c1)/(b) 4.83,
    4.70, 4.91 and 4.65, 5.09, 4.68. No difference this benchmark
    resolves. A perf profile of (c1) in the rate search (the
    profile-guided build of 96fdd85) put 21% of loopguard's CPU in
    `decide`, 9.7% in the world lookup and 10.8% in mimalloc's fast path,
    almost all of it on the load of a free block's first word: blocks
    freed long before, out of the CPU caches, as the world state is.
  - *This run*: (c1)/(b) rate 0.41 [0.41], (c2)/(b) 0.26 [0.31]; in msg/s
    (c1) 122k [152k], (c2) 78k [116k]; ceilings (a2)/(b) 0.51 [0.49],
    (b2)/(b) 0.51 [0.49]. CPU in the table (c1)/(b) 3.95 [3.34], (b2)/(b)
    1.53 [1.05]; side by side, the steadier measure, (c1)/(b) median 4.57
    [4.63], (b2)/(b) 1.54 [1.62], (c1)/(b2) 2.97 [2.91]. Criterion 3.05 /
    3.41 / 5.96 µs [3.20 / 3.37 / 5.65], samples' medians 2.85 / 3.16 µs
    [3.00 / 3.18]; single decisions p99 7.26 µs [7.00], 5.35 with the
    upkeep between [4.38] (the slowest of those 2.4 ms: the machine, not
    a decision); busy worlds p50 5.23 [5.27], p99 11.58 [11.57]. The
    mention parser, unchanged but for the agent's path, took 97 ns [86]
    to scan. Idle world 918 bytes [918]; the flood levelled off at
    103.1-110.5 MiB [103.2-112.0]. Policy hook (p1)/(p0) 0.42 [0.31],
    (p2)/(p0) 0.12 [0.12]. 0 drops.

- **A stricter benchmark (2026-11-23 09:56 UTC, commit 96fdd85).** A
  review of the relay benchmark's honesty changed what it measures, so
  this run's figures and the earlier runs' are not alike:
  - a rate that fails once is not sustained: there is no second try (in
    the run of 08:54 UTC (c1)'s 122k passed only on its second try, with
    p99 50.62 ms on its first; (b2)'s too);
  - peak RSS is the kernel's high-water mark over the relay's life, warm-up
    and failed steps included: (c1) 910.5 MiB at turn 42, where sampling
    the passed steps read 518.2 at turn 25 in the run of 08:54 UTC; the bare
    relay's 96.2 MiB is its buffers in failed steps, which sampling missed;
  - CPU comes from each process's CPU clock in nanoseconds, not /proc's
    10 ms ticks;
  - slow-consumer drops are counted from the warm-up on.
  Two follow-ups came after this run (a6ad4ab): the table's † for a failed
  common-rate step now also counts a producer that fell behind, as the
  rate search does, and drops during a failed step's drain count as that
  step's. Neither changes a figure here: no step at the common rate
  failed, and every drop count was 0. No change on loopguard's measured
  path since the run of 08:54 UTC (figures in brackets, from the looser
  benchmark): (c1)/(b) rate 0.41 [0.39], (c2)/(b) 0.31 [0.26]; in msg/s
  (a) 727k [720k], (b) 369k [316k], (c1) 152k [122k], (c2) 116k [83k];
  ceilings (a2)/(b) 0.49 [0.57], (b2)/(b) 0.49 [0.68]. CPU in the table
  (c1)/(b) 3.34 [3.69], (b2)/(b) 1.05; side by side (c1)/(b) median 4.63
  [4.50], (b2)/(b) 1.62 [1.50], (c1)/(b2) 2.91 [2.95]. Criterion 3.20 /
  3.37 / 5.65 µs [3.35 / 3.68 / 6.42], samples' medians 3.00 / 3.18 µs
  [3.11 / 3.45], slowest 5.80 / 6.23 [6.47 / 6.70]; single decisions p99
  7.00 µs [7.46], 4.38 with the upkeep between [4.54]; busy worlds p50
  5.27 [4.47], p99 11.57 [10.07]. Idle world 918 bytes [918]; the flood
  levelled off at 103.2-112.0 MiB [103.0-109.4]. Policy hook (p1)/(p0)
  0.31 [0.38], (p2)/(p0) 0.12 [0.15]. 0 drops.

- **Fewer instructions for a subject and a JSON string (2026-11-23
  08:54 UTC, commit 7992332).** A subject's tokens are found a byte at a
  time (`str::split('.')` set up a `memchr` search for each token of a
  few bytes), and a JSON string's last bytes are tested as one
  space-padded word instead of a byte at a time. callgrind (16,000
  decisions over 2,000 worlds, the relay's rules): 339.7M instructions
  before, 331.5M after (-2.4%). Criterion, three alternating pairs of
  builds (approved events off / on / optional rules on): before 3.85 /
  3.95 / 6.60, 3.56 / 3.97 / 6.45 and 3.12 / 3.72 / 6.18 µs; after 3.32 /
  3.71 / 6.34, 3.26 / 3.59 / 6.11 and 3.45 / 3.82 / 6.11: within the
  noise. Also on a measured path since the last run, with no cost to be
  seen: the JetStream worker checks the grace period before each message
  a world held back behind a policy answer (the relay benchmark runs core
  NATS and no policy hook). In this run (the run of 07:32 UTC in
  brackets): (c1)/(b) rate 0.39 [0.26], (c2)/(b) 0.26 [0.19], CPU in the
  table 3.69 [7.56]; ceilings (a2)/(b) 0.57 [0.54], (b2)/(b) 0.68 [0.44].
  Side by side: (c1)/(b) median 4.50 [4.59], (b2)/(b) 1.50 [1.76],
  (c1)/(b2) 2.95 [2.59]. Criterion 3.35 / 3.68 / 6.42 µs [3.89 / 4.00 /
  6.56], samples' medians 3.11 / 3.45 µs [3.69 / 3.91], slowest 6.47 /
  6.70 [7.71 / 6.20]; single decisions p99 7.46 µs [8.20], 4.54 with the
  upkeep between [5.54]; busy worlds p50 4.47 [5.52], p99 10.07 [12.73].
  Idle world 918 bytes [918]; the flood levelled off at 103.0-109.4 MiB
  [103.2-109.4]. Policy hook (p1)/(p0) 0.38 [0.34], (p2)/(p0) 0.15
  [0.12]. 0 drops.

- **The same code again (2026-11-23 07:32 UTC, commit 2d2c93f).** Since
  the run of 06:50 UTC (figures in brackets) only a refactor is on a
  benchmarked path: the two places that put back an evicted world share
  one function. This run shows how far the shared machine moves between
  runs of nearly the same code. The bare relay ran much faster ((b) 372k
  msg/s [298k], 1.50 µs of CPU a message [2.33]) and loopguard slower
  ((c1) 98k [130k], 11.33 µs [8.50]), so the table's ratios are the
  worst yet: (c1)/(b) rate 0.26 [0.43], (c2)/(b) 0.19 [0.25], CPU 7.56
  [3.64]; the ceilings fell with them, (a2)/(b) 0.54 [0.76] and (b2)/(b)
  0.44 [0.54]. Side by side, where the three relays share the same
  seconds, the CPU ratios barely moved: (c1)/(b) median 4.59 [4.43],
  (b2)/(b) 1.76 [1.64], (c1)/(b2) 2.59 [2.70]. Criterion 3.89 / 4.00 /
  6.56 µs [3.72 / 3.78 / 7.87], samples' medians 3.69 / 3.91 µs, slowest
  7.71 / 6.20; single decisions p99 8.20 µs [8.04], 5.54 with the
  upkeep between [6.31] (its slowest, 21.9 ms, a one-off far past its
  p99.9 of 49 µs, where the previous run's slowest was 0.19 ms:
  likely the shared machine, not looked into further); busy worlds p50 5.52 [5.66], p99 12.73
  [13.41]. Idle world 918 bytes [918]; the flood levelled off at
  103.2-109.4 MiB [102.7-109.4]. Policy hook (p1)/(p0) 0.34 [0.43],
  (p2)/(p0) 0.12 [0.13]. 0 drops.

- **A world evicted while it is decided is put back (2026-11-23 06:50
  UTC, commit f57a4b6).** After each decision's commit,
  `Worlds::weigh` now also looks whether the cache still holds the world
  (one `contains_key` a decision) and puts it back if another thread's
  lookup or a scrape evicted it meanwhile. Criterion, two alternating
  runs of each build (decisions with approved events off / on / optional
  rules on): before 3.81 / 4.15 / 7.65 and 3.41 / 3.89 / 6.47 µs, after
  3.84 / 3.96 / 6.35 and 3.45 / 3.85 / 6.10: within the noise. Also on
  a benchmarked path since the last run, each with no cost to be seen:
  the payload parser's error now carries the id its JSON gave (a larger
  error type; the id is read before the content is checked), and a
  speaker's key (optional rules) hashes its kind. Not on one: `egress_acks`
  refusals, a log line's id. This run's machine was much faster for the
  server and the bare relay ((a) 726k msg/s [396k], (b) 298k [202k]) and
  hardly for loopguard ((c1) 130k [122k]), so the rate ratios fell: (c1)/(b) 0.43 [0.60], (c2)/(b) 0.25
  [0.43] ((c2) at 74k below (c3), with more rules, at 93k: the shared
  machine's noise), and the copying relay's with them, (b2)/(b) 0.54
  [0.68]; (a2)/(b) 0.76 [0.72]. Side by side, CPU a message: (c1)/(b) median 4.43 [4.57],
  (b2)/(b) 1.64 [1.57], (c1)/(b2) 2.70 [2.95]. Criterion 3.72 / 3.78 /
  7.87 µs [4.97 / 3.68 / 6.96]; single decisions p99 8.04 µs [8.69], with
  the upkeep between 6.31 [6.22]; busy worlds p50 5.66 [5.21], p99 13.41
  [11.89]. Idle world 918 bytes [918]; the flood levelled off at
  102.7-109.4 MiB [103.1-110.7]. Policy hook (p1)/(p0) 0.43 [0.35],
  (p2)/(p0) 0.13 [0.12]. 0 drops.

- **A wider sketch for `similar` (2026-11-23 04:48 UTC, commit
  863eabe).** Each remembered word set carries a 128-bit sketch of its
  words instead of 64 bits. Of the workload's answers (23 content words,
  all but one or two shared), 3.2% of pairs get past the sketches to a
  merge of the sets at the benchmark's threshold of 0.99, against 11.2%
  with 64 bits; each merge reads a set out of the CPU caches. Criterion,
  two alternating runs of each build of the same tree: 7.10 and 7.14 µs a
  decision with every optional rule on, against 7.36 and 7.33 (about 3%
  less), for 8 bytes more a remembered set. Nothing else since the last
  run is on a benchmarked path (permissions, readiness, the policy
  breaker's bookkeeping, log filters). The machine was slow and uneven in
  this run and in one at 04:21 UTC of nearly the same code: criterion
  gave 4.97 / 3.68 / 6.96 µs (approved events off / on / optional rules
  on) [3.51 / 4.12 / 6.87], the unchanged path with events off slower
  than with them on, and 4.97 / 5.02 / 7.03 at 04:21. Single decisions
  back to back p99 8.69 µs [7.59] (8.24 at 04:21), 6.22 with the upkeep
  between [5.27] (5.34); busy worlds p50 5.21 [5.71], p99 11.89 [12.10].
  Relay: (c1)/(b) rate 0.60 [0.48] (0.41 at 04:21), (c2)/(b) 0.43 [0.39]
  (0.39); side by side (c1)/(b) CPU median 4.57 [4.42] (4.21), (b2)/(b)
  1.57 [1.58] (1.67), (c1)/(b2) 2.95 [2.79] (2.58). Policy hook (p1)/(p0)
  0.35 [0.47] and (p2)/(p0) 0.12 [0.19]: (p1) and (p2) rose (42.3k and
  14.2k agent messages/s against 30.8k and 12.8k), the baseline more
  (121k against 66k; a burst of 4,800 messages). Idle world 918 bytes
  [918]; the flood levelled off at 103.1-110.7 MiB [102.8-108.9]. 0 drops.

- **A publish allocates less (2026-11-23 02:56 UTC, commit 8883ae6).**
  A fifth patch to the vendored async-nats (vendor/async-nats/PATCH.md):
  a publish keeps an owned subject's bytes instead of copying them, and
  writes the `Nats-Msg-Id` header block straight into the connection's
  buffer instead of building it in a `Vec` grown from empty (four
  reallocations) and converting it. loopguard freed 20.0 blocks a message
  against 31.1 (uprobes on `mi_free` and `Judge::decide`, side by side at
  20,000 msg/s). Five alternating side-by-side runs of each build (15
  steps each): the copying relay (b2) 4.83 µs of CPU a message against
  5.29, loopguard (c1) 13.22 against 13.59, the bare relay (b) 2.84
  against 2.82; medians (b2)/(b) 1.71 [1.87], (c1)/(b) 4.65 [4.95]. The
  (b) and (b2) examples use the same client, so the baselines gained too.
  Tried after it and not kept: naming an approval's destinations (the
  event's `delivered_to`) only where an event can report them, which took
  loopguard to 17.5 freed blocks a message [19.9] with approved events
  off, but its CPU a message within the noise (three alternating side by
  side runs each: 11.26 µs against 11.13), for a field filled on a
  condition.
  This run's binaries also held a change to JetStream shutdown, not on any
  benchmarked path (the intake hands back what it pulled after the
  workers, not at the signal). Relay: (a) 465k msg/s, the bare relay 253k;
  ratios (c1)/(b) rate 0.48 [0.41], (c2)/(b) 0.39 [0.28], (a2)/(b) 0.57
  [0.51], (b2)/(b) 0.85 [0.54]. CPU per message: side by side (b2)/(b)
  median 1.58 [1.75], (c1)/(b2) 2.79 [2.46], (c1)/(b) 4.42 [4.31]; in the
  table (c1)/(b) 2.71 [5.33], against a bare relay at 3.50 µs a message
  here (2.00-2.33 side by side in the same run), so the table's figure is
  the noisier one. Criterion 3.51 / 4.12 / 6.87 µs [3.63 / 4.13 / 6.90];
  single decisions p99 7.59 µs [8.06], 5.27 µs with the upkeep between
  [5.36]; busy worlds at their steady state p50 5.71 µs [5.91], p99 12.10
  [12.62]. Idle world 918 bytes [918]; the flood of unique worlds levelled
  off at 102.8-108.9 MiB resident [102.8-109.4]. Policy hook (p1)/(p0)
  0.47 [0.45], (p2)/(p0) 0.19 [0.18]. 0 drops.

- **Busy worlds hold less (2026-11-23 01:39 UTC, commit 0c5e64f).** A
  remembered message is now kept by a seeded 64-bit hash of its id, not
  by the id; a full window no longer doubles its room to take one more
  item; the duplicate window is scanned a block of 16 hashes at a time.
  A busy world at its caps (`state_memory`'s new rows: 200 worlds of
  2,000 agent messages) holds 138 KiB resident in one thread and 289 KiB
  with a thread a message, against 233 and 354 KiB before (same rows, run
  on the code before), and weighs 181 and 287 KiB against 260 and 473;
  an idle world with one message 918 bytes [958]. Callgrind, 20,000
  decisions in 200 busy worlds with an 8 MiB last-level cache: 7% fewer
  instructions, 38% fewer last-level misses. In time the gain is within
  this machine's noise: the old and new code alternated minutes apart
  gave busy-world p50s of 5.52 / 5.21 µs (old) and 5.09 / 5.31 µs (new),
  and the same criterion figures. The decision benchmark now also times
  2,000 busy worlds at their steady state: p50 5.91 µs, p99 12.62 µs,
  about twice a young world's, as each decision's reads of its world's
  windows and maps miss the CPU's caches. This run was slower than the
  last throughout (the same code's young-world p50 3.19 µs against about
  2.7 µs in runs an hour earlier): criterion 3.63 / 4.13 / 6.90 µs
  [3.32 / 3.99 / 5.80]; single decisions p99 8.06 µs [6.98], 5.36 µs
  with the upkeep between [5.63]. Relay: (a) 726k msg/s, the bare relay
  298k at 2.00 µs of CPU a message (its rate 39% above the last run's,
  loopguard's 31%). Ratios: (c1)/(b) rate 0.41 [0.43], (c2)/(b) 0.28
  [0.41], (a2)/(b) 0.51 [0.57], (b2)/(b) 0.54 [0.68]. CPU per message:
  (c1)/(b) 5.33 in the table [3.37], side by side 4.29-4.81 (median
  4.31) [4.55]; (b2)/(b) median 1.75 [1.67]; (c1)/(b2) median 2.46
  [2.74]. Peak RSS of (c1) 500 MiB [629]. Under the flood of unique
  worlds resident memory levelled off at 102.8-109.4 MiB [106.6-112.2];
  with 256-byte ids it held 215.7-227.1 MiB [194.0 at the end], since
  the state's weights now err less high for the same 256 MiB. 0
  slow-consumer drops. The policy hook benchmark: (p1)/(p0) 0.45
  [0.31], (p2)/(p0) 0.18 [0.13].

- **The latest runs, and two benchmarks corrected.** The runs of
  2026-11-23 00:12 UTC (relay) and the criterion run after it are of
  commit 59448b6. The criterion decision benchmark was wrong until this
  run: its rules read the real clock, so at the bench's pace an agent
  spoke again within its 1 s cooldown, and after each world's first five
  messages about 70% of the timed decisions were cheap cooldown
  rejections (the "100% approved" it printed was of the first 50,000
  decisions only, and its inputs wrapped). Its rules now read a workload
  clock at 20,000 messages a second, each timed decision is of a new
  message, and the approved share is counted over the timed decisions:
  100%. Every earlier criterion figure below understates a decision.
  Now: 3.32 / 3.99 / 5.80 µs a decision (approved events off / on /
  optional rules on), one busy world 1.56 µs; single decisions back to
  back p99 6.98 µs (6.76 for agent messages, 7.78 for a human's
  broadcast), 5.63 µs with the cache's upkeep between them; the first
  message of a world p99 8.37 µs. Target 3 (p99 under 5 µs) is not met.
  A profile of the approved path: moka's world lookup 12% (its bucket
  and key loads miss the CPU's caches: 10,000 worlds each holding about
  600 remembered messages), commit 10%, hash-map lookups in the
  world's state 8%. The relay
  benchmark now counts every copy toward loss (a broadcast's five, not
  only the first to arrive), fails a step on any copy beyond a message's
  own, and times latency from the producer's schedule (see below). Its
  figures: (a) 463k msg/s, the bare relay 214k at 3.17 µs of CPU a
  message. Ratios: (c1)/(b) rate 0.43, (c2)/(b) 0.41, (a2)/(b) 0.57,
  (b2)/(b) 0.68, (c1)/(b2) 0.64. CPU per message: (c1)/(b) 3.37 in the
  table and 4.33-4.73 side by side (median 4.55); (b2)/(b) 1.53 and
  1.64-1.73 side by side (median 1.67); (c1)/(b2) median 2.74. An idle
  world with one message holds 958 bytes at 100k and 1M worlds; under
  the flood of unique worlds resident memory levelled off at
  106.6-112.2 MiB. 0 slow-consumer drops. The policy hook benchmark:
  (p1)/(p0) 0.31, (p2)/(p0) 0.13. Code on the relay's path since the
  runs of 21:57 UTC: routing reads an agent's content for paragraph-start
  mentions only, normalisation stops at the first token that is no name,
  inline mentions must be whole words, and a world records the second of
  its last message (one atomic load a message, one store a second).
- **The runs of 21:57 UTC.** The runs of 2026-11-22 21:57 UTC (relay) and the
  criterion run after it are of commit 1e7ca9f (loopguard's code as of
  2409e54).  Since the runs of 19:20 UTC (their figures in brackets) the
  relay's path changed by one test a worker loop (whether a JetStream
  message is held back, for its in-progress acknowledgements); the rest
  was JetStream, configuration and logging. The machine was in another
  state again: (a) sustained 617k msg/s [464k], the bare relay 238k
  [283k] at 3.00 µs of CPU a message [2.67]; the mention parser 81 ns
  [80]. Ratios: (c1)/(b) rate 0.44 [0.34], (c2)/(b) 0.39 [0.25],
  (a2)/(b) 0.54 [0.59], (b2)/(b) 0.49 [0.51], (c1)/(b2) 0.89 [0.67],
  (c2)/(c1) 0.89 [0.72]. CPU per message: (c1)/(b) 3.28 in the table
  [3.81] and 4.20-4.57 side by side (median 4.46 [4.21]); (b2)/(b) 1.56
  [2.06] and 1.73-1.86 side by side (median 1.77 [1.88]); (c1)/(b2)
  2.42-2.52 side by side (median 2.46 [2.24]); (c2)/(b) 3.50 [4.44].
  Criterion: 2.24 / 2.49 / 3.66 µs a decision (approved events off / on
  / optional rules on) [2.42 / 2.59 / 3.92], one busy world 1.66 µs
  [1.67]; its samples' p99 2.83 / 3.84 µs [3.21 / 3.89]; single decisions
  back to back p99 6.00 µs [6.70], 5.64 for agent messages [6.13], 3.92
  µs [5.02] with the cache's upkeep between them. An idle world with one
  message holds 958 bytes [958]; under the flood of unique worlds,
  resident memory levelled off at 107.0-112.6 MiB [106.5-113.4]. The
  policy hook benchmark: (p1)/(p0) 0.53 [0.50], (p2)/(p0) 0.20 [0.18].
  The targets stand where they stood: 1 and 2 not met, (c1) here at
  0.89 of (b2)'s rate, the floor of any relay with its output.
- **The runs of 19:20 UTC.** The runs of 2026-11-22 19:20 UTC (relay) and the
  criterion run after it are of commit b02f010 (the code of e57a2fa). Two changes since
  the runs of 17:08 and 17:09 UTC (of ff3f9e3; their figures in brackets)
  reached the relay's path: a worker hands aside a message that waits for
  the policy service and goes on with other worlds (with the hook off, as
  here, each message takes the same steps: decide, then publish), and
  every event carries a `Nats-Msg-Id` header (one more short string a
  decision in (c2)). The machine was much slower in this run: (a)
  sustained 464k msg/s [780k], the bare relay 283k [372k] at 2.67 µs of
  CPU a message [1.67]; the mention parser, in the CPU's caches, took 80
  ns [83]. Ratios: (c1)/(b) rate 0.34 [0.46], (c2)/(b) 0.25 [0.35],
  (a2)/(b) 0.59 [0.61], (b2)/(b) 0.51 [0.61], (c1)/(b2) 0.67 [0.76],
  (c2)/(c1) 0.72 [0.76]. CPU per message: (c1)/(b) 3.81 in the table
  [3.90] and 4.06-4.33 side by side (median 4.21 [4.45]); (b2)/(b) 2.06
  [1.80] and 1.71-1.93 side by side (median 1.88 [1.73]); (c1)/(b2)
  2.17-2.46 side by side (median 2.24 [2.78]); (c2)/(b) 4.44 [4.50]. In
  CPU a message neither change shows: loopguard's ratios to the
  baselines are the same or lower. Its rate fell further behind (b2)'s
  than in the last run (0.67 against 0.76); one run of a machine this
  much slower does not say whether the changes or the machine did that.
  Criterion: 2.42 / 2.59 / 3.92 µs a decision (approved events off / on /
  optional rules on) [2.22 / 2.44 / 3.33], one busy world 1.67 µs [1.57];
  its samples' p99 3.21 / 3.89 µs [4.78 / 3.60]; single decisions back to
  back p99 6.70 µs [5.75], 6.13 for agent messages, 5.02 µs [3.96] with
  the cache's upkeep between them. An idle world with one message holds
  958 bytes [958]; under the flood, resident memory levelled off at
  106.5-113.4 MiB [106.6-111.9]. The policy hook benchmark: (p1)/(p0)
  0.50, (p2)/(p0) 0.18 (its own section below).
- **The runs of 17:08 UTC.** The runs of 2026-11-22 17:08 UTC (relay) and 17:09
  UTC (criterion) are of commit 0b11ed5 (the code of ff3f9e3). Since the
  runs of 15:06 and 15:07 UTC (of 415da51, whose figures are in brackets
  here and which the rest of these notes quote) two changes reached the
  relay's path: the core intake reads the raw and join subscriptions in
  turn, and a world's duplicate window is kept in two queues (both
  below); the rest was outside it for this workload (a pass no longer
  joins the speaking order, a message with a long id is held as the
  world's latest, permission errors, readiness, reloads, signals, TLS
  files). The machine was much faster in this run: (a) sustained 780k
  msg/s [396k], the bare relay 372k [238k] at 1.67 µs of CPU a message
  [3.00], the mention parser 83 ns [84]. Ratios: (c1)/(b) rate 0.46
  [0.46], (c2)/(b) 0.35 [0.35], (a2)/(b) 0.61 [0.58], (b2)/(b) 0.61
  [0.51], (c1)/(b2) 0.76 [0.90]. CPU per message: (c1)/(b) 3.90 in the
  table [3.00] and 4.09-5.00 side by side (median 4.45 [4.00]); (b2)/(b)
  1.80 [1.52] and 1.45-1.80 side by side (median 1.73 [2.11]); (c1)/(b2)
  2.58-2.81 side by side (median 2.78 [1.92]). In this faster run the
  baselines' CPU a message fell more than loopguard's ((b) by 44%, (b2)
  by 44%, (c1) by 38%), so the CPU ratios rose; I have not found why (a
  decision waits on memory more than the baselines' work does, which a
  faster clock would not shorten, is a guess, not measured). Criterion:
  2.22 / 2.44 / 3.33 µs a decision (approved events off / on / optional
  rules on) [2.51 / 2.61 / 3.85], one busy world 1.57 µs
  [1.71]; its samples' p99 4.78 / 3.60 µs [3.38 / 3.61]; single decisions
  back to back p99 5.75 µs [6.36], 5.37 for agent messages, 3.96 µs [4.72]
  with the cache's upkeep between them. An idle world with one message holds
  958 bytes [900]: the duplicate window's second queue and the slot for a
  latest message with a long id are 40 bytes by arithmetic; the other 18
  I have not accounted for (allocator rounding is a guess).
- **Code.** The runs of 2026-11-22 15:06 UTC (relay) and 15:07 UTC
  (criterion) are of commit 415da51. The changes since the runs of 12:45
  and 12:46 UTC (of 4d91e52; their figures are first in the brackets
  below) are outside the core-mode relay's path: JetStream intake and its
  replay cache, a flush that waits for the server's answer (JetStream
  acknowledgements and shutdown), start-up, shutdown, logging and
  configuration bounds. The machine was much slower in this run: the
  server alone, (a), sustained 396k msg/s against 722k at 12:45, the bare
  relay 238k against 283k and cost 3.00 µs of CPU a message against 2.33,
  while the mention parser, in the CPU's caches, took the same 84 ns: the
  slowness was in what the server, the relays and the producer share.
  Ratios inside the run are what to compare. After that run the core
  intake changed: it reads the raw and join subscriptions in turn
  (`futures::stream::select`) where it read raw first always. Side by
  side (`BENCH_ONLY=pair`, profile-guided builds of both, run old, new,
  new, old on 2026-11-22 after 15:30 UTC), (c1)/(b) had medians of 4.25
  and 3.93 before and 4.36 and 4.31 after, (c1)/(b2) 2.48 and 2.57
  before and 2.67 and 2.46 after: within the spread of unchanged code.
  The runs of 12:45 UTC
  (relay) and 12:46 UTC (criterion) were of commit 4d91e52. Since the
  runs of 11:21 and 11:22 UTC (of e71518c; their figures are next in the
  brackets below) a
  world is weighed after each decision (`state.max_bytes`: its footprint
  is summed from counters, and the cache entry re-weighed when it has
  outgrown its weight), and async-nats drops a draining subscription only
  when its PING is answered (vendor/async-nats/PATCH.md; shutdown only).
  The benchmarks set `max_bytes` to 8 GiB, as they measure deciding, not
  evicting. Criterion put the weighing at 2.34 against 2.15 µs a decision
  (approved events off), within this machine's run-to-run spread (2.13-2.50
  µs for unchanged code on 2026-11-22); loopguard's CPU side by side was
  about 5% higher than at 11:21, the same spread. The shared parts of the
  machine were slower in this run: (a2) sustained 153k msg/s against 190k
  at 11:21, (a) about the same (722k against 727k), the mention parser as
  fast (83 ns against 85). The runs of 11:21 and 11:22 UTC were of
  e71518c; the changes between them and the runs of 10:12 and 10:26 UTC
  (of b578cea; their figures are in brackets below, with those of 07:56)
  were outside the relay's path for this workload: the size of a header
  id, a set for long runs of mentions, JetStream's replay cache, log
  escaping. Since the runs of 07:56 and 07:57 UTC
  (of 1488a96; their figures are in brackets below) loopguard, the
  baselines and the benchmark itself build with async-nats patched to keep
  its connection on subjects and headers it cannot read
  (vendor/async-nats/PATCH.md), and loopguard counts deliveries as it
  publishes them. Neither changed a decision's instructions (callgrind,
  2,000 worlds, 6 messages each: 263.9M before, 263.6M after). A first
  version of the patch read every header block a byte at a time, 0.22 µs
  more CPU a message for any subscriber; a relay run of 09:17 UTC caught
  it, and a slow stretch of the machine (the mention parser took 140 ns),
  and is not published.
- **Steady state.** Each set-up is one process for all its steps. An
  unmeasured warm-up sends eight turns of all 100,000 worlds, and every
  measured message is a later turn of a world already held, so loopguard's
  rules see real conversations (humans, mentions, duplicates) and not a
  stream of new worlds. Eight, because a world's fourth agent speaks at
  its eighth turn at the latest: from then on loopguard's roster is whole,
  a human's message goes to all four inboxes and an agent's to the inbox
  it mentions. Published runs before 2026-11-22 02:46 UTC warmed up with
  one turn, so their measured steps caught rosters still filling (fewer
  copies per message) and less state per world: their CPU and memory
  figures are lower than this steady state's. The benchmark counts loss against what
  loopguard should approve, so a rule rejecting more than the designed
  ~10% fails it. Since 2026-11-22 23:59 UTC it counts every copy (each of
  a broadcast's five, not only the first to arrive), a copy beyond a
  message's own (a duplicate approved) fails the step, and latency runs
  from when a message was due on the producer's schedule (its 1 ms tick),
  not from when the producer sent it, so a stalled producer no longer
  hides its stall (coordinated omission); that adds to every set-up alike
  the time the producer takes to publish the rest of that tick's burst.
- **Spread-out turns.** Each world's conversation is shifted by
  `world % 10` turns, so at any moment a fifth of the traffic is human, as
  within each world. Runs before 2026-11-21 lacked that: all 100,000 worlds
  reached their human turn together, and for 1-2 s at a time loopguard got
  nothing but five-copy broadcasts. Those stretches were the failing steps
  of those runs, and they made the CPU figure depend on which turn the
  common-rate step caught.
- **loopguard's output costs more than the bare relay's.** The bare relay
  publishes one copy of each input, unchanged. For this workload the
  contract asks loopguard for about 1.8: a human's message to the
  transcript and four inboxes, an agent's to the inbox it mentions, a
  duplicate's rejection event, each copy egress JSON about 1.8 times the
  input's size with a `Nats-Msg-Id` header. Two set-ups measure what that
  output costs by itself:
  - **(a2)** publishes exactly those copies from the producers, with no
    relay and no raw hop: the server, producers and consumer fill the
    machine at it. It is a rough ceiling for a relay publishing
    loopguard's copies, not a proven one: its producers build each copy
    with string formatting in the benchmark's own process (112-114% of a
    CPU in its failed steps of 2026-11-23 08:54 UTC), and may be what
    limits it.
  - **(b2)**, `examples/copy_relay.rs`, is a relay like (b) that
    publishes those copies instead of one: no parsing, no state, no rules
    (it reads the workload's arithmetic for what loopguard decides). It
    is the floor of any relay with loopguard's output. Side by side, the
    benchmark checks that it published as many messages as loopguard and
    as many bytes within 1% (from nats-server's `/connz`), and that
    loopguard's public and private copies (`loopguard_deliveries_total`)
    are the ones the workload's messages should yield; the run fails if
    not.

  In the run of 2026-11-22 15:06 UTC (the runs of 12:45, 11:21, 10:12
  and 07:56 UTC in brackets), (a2) reached 0.58 [0.54, 0.67, 0.61, 0.44]
  of the bare relay's rate and (b2) 0.51 [0.67, 0.76, 0.51, 0.58]:
  target 1's (c1)/(b) ≥ 0.9 is out of reach for the relays measured here
  with this output on this machine, and (c2)/(b) ≥ 0.6 at the edge of the reach or
  past it. (c1) reached 0.90 [0.76, 0.80, 1.06, 0.71] of (b2)'s rate and
  0.80 [0.95, 0.90, 0.89, 0.94] of (a2)'s. For CPU, (b2) cost 1.52
  [1.57, 1.12, 2.14, 1.62] times the bare relay in the table (its figures
  come minutes apart) and 2.00-2.11 side by side (median 2.11 [1.77,
  1.69, 1.73, 1.77]; two more side-by-side runs on 2026-11-22: 1.58-1.67
  and 1.64-1.79): target 2's (c1)/(b) ≤ 1.5 is at or below what
  loopguard's output costs before any decision.
- **What loopguard's own work costs**: (c1)/(b2), the CPU loopguard spends
  beyond its output (parsing the JSON, the world's state, the rules,
  building the egress JSON and the message key), was 1.87-2.00 side by
  side (median 1.92 [2.48, 2.37, 2.33, 2.35]; 2.38-2.80 and 2.28-2.57 in
  two more runs) and 1.97 [2.54, 2.42, 2.13, 2.24] in the table. A perf profile of loopguard
  alone, in the rate search's first steps (40-50k msg/s; 2026-11-22
  03:25 UTC): about 64% of its CPU in
  the decision, of which moka's world lookup is 12% of the process (among
  100,000 worlds each lookup misses the CPU caches) and recording the
  approved message about 9% (a third of it growing young worlds' message
  maps, whose rehash reads every key: keeping each id's hash beside it,
  so that growing reads no id, measured no faster in process, and was not
  kept); about 18% in the NATS client's
  connection task; the rest in the hand-off to the worker, the egress
  JSON and the kernel's wake-ups. Allocation is about 14% of the process
  across those parts, more than its instructions suggest: in a callgrind
  cache simulation over 100,000 worlds, taking a block off mimalloc's
  free list was 15% of all first-level cache misses (about eight a
  decision), the blocks being cold. jemalloc in its place measured the
  same (loopguard alone, 40-78k msg/s, within the run-to-run noise). Much
  of the decision's cost here is memory latency: in process, a build
  without LTO decided the workload's messages in about 2.6 µs each over
  1,000 worlds (in the CPU caches) and 3.3 µs over 100,000 (a one-off
  measurement of 2026-11-22); in the relay, sharing the CPUs and their
  caches with the server, more again. (c1)/(b) was 3.00 [4.00, 2.71,
  4.57, 3.62] in the table and 3.94-4.06 side by side (median 4.00 [4.38,
  4.00, 3.87, 4.08]): not ≤ 1.5.
- **Where a decision waits** (2026-11-22, session 23). perf, sampling
  loopguard at 1999 Hz for 40 s of (c1)'s rate search from 152k msg/s up
  (`BENCH_ONLY=c1`, the profile-guided build of f5bbe65's code, the same
  on this path as ff3f9e3's), by own time: `Judge::decide`, with what is
  inlined into it, 27%; moka's world lookup 11%; recording the approved
  message 7.5%; memmove 4.8% (spread over the client's write buffer and
  the hand-offs through channels); the worker's loop 4.4%; mimalloc about
  5%; the NATS client's connection task 3.4%; memcmp 3.1%; the egress JSON
  2.6%; clock reads 2.4%; moka's upkeep 1.4%. Inside `decide` the hottest
  instructions are loads that miss the CPU caches: the duplicate window's
  scan (9% of `decide`), the message map's probe for the parent id (its
  control bytes 8.6%, the key 7.9%), the count of the parent's thread id
  `Arc` when it is cloned (6.4%), and an `Arc` released as an old entry
  leaves (7.0%). Here each world is touched once in about 100,000
  messages, so each of these goes to memory: that is most of what
  (c1)/(b2) measures. A layout touching fewer cache lines per world (ids
  held inline rather than behind `Arc<str>`, the window beside the map)
  is what could lower it. Tried on 2026-11-22 (session 25) for the ids:
  every message and thread id of up to 23 bytes held inline (`SmolStr`,
  as names are), which removes the key's and the thread id's own
  allocations from a parent lookup and from a forgotten entry. It did not
  pay: in process over 100,000 worlds (`DECISION_WORLDS=100000`),
  criterion moved by -1% to +10% with the workload's short ids and by -6%
  to +4% with 36-byte ones, inside the noise of runs minutes apart (the
  same old code measured 3.95 and 2.70 µs); callgrind's cache simulation
  (20,000 worlds, 10 messages each) counted 0.3% fewer first-level data
  misses and 1.5% more instructions. The entries grow by 8 bytes an id,
  and the misses move to the map's larger buckets. Not kept.
  Side by side at 17:48 UTC (the same
  binary): (b2)/(b) 1.58-1.67 (median 1.62), (c1)/(b2) 2.62-2.74 (2.65),
  (c1)/(b) 4.23-4.42 (4.33). Three runs of (c1) alone sustained 152k,
  162k and 152k msg/s (perf sampling the second and third for part of
  their steps); (b) was not run beside them.
- **Every rule on, (c3)**: the contract's rules and loopguard's own five
  (benches/shared/optional_rules.toml), set so that they seldom reject;
  the loss is counted against what the contract's rules should approve,
  so a step where they rejected more fails. In the run of 15:06 UTC (c3)
  sustained 0.68 [0.84, 0.71, 0.72, 0.80] of (c1)'s rate (0.31 [0.43,
  0.43, 0.39, 0.33] of the bare relay's) and cost 13.33 µs of CPU a
  message against (c1)'s 10.50 [11.00 against 9.33; 11.17 against 7.67;
  12.83 against 10.67; 10.67 against 7.83]. A run of (c1) and (c3) alone
  after the 06:14 run (06:20 UTC) gave
  12.33 against 8.50 µs, and 0.90 of the rate: here the relay's CPU
  figures move more than the optional rules cost, and the in-process
  figures below are the steadier measure. Most of the difference was
  `similar`: it compares each agent message with every approved message
  of its world in the window (300 s; here 26 and more), and each earlier
  message's word set is an allocation of its own, out of the CPU caches
  by then, so loading the sets was most of the rule's time. Since
  2026-11-22 06:00 UTC each set carries a 64-bit sketch of its words,
  which bounds how many words two sets can share: most earlier sets are
  ruled out without being read, and a merge stops once the threshold is
  out of reach (a proptest holds the answers to a full count). In process
  (a build without LTO, 100,000 worlds, 30 messages each) every optional
  rule on now decides in 5.96-6.08 µs, against 7.15-7.76 µs before and
  3.4-3.9 µs with them off. Since 07:20 UTC the substance of ASCII text
  is cut a byte at a time and the stemmer is one match: callgrind (2,000
  worlds, 20 messages each) counted 26.4k instructions a decision with
  every optional rule on, against 29.1k. Tried and left out, each within
  the noise or worse: a branchless merge; a lookup table of the new
  message's words; a world's word sets end to end in one buffer, for the
  prefetcher (callgrind: 1.4% fewer first-level read misses, 5% more write
  misses); a binary search of the stop words and memchr to split words
  (both more instructions than what they replaced). (c3)'s peak RSS,
  1197 [1198, 1343, 1047] MiB (1340 at 06:20), is 11-14 KiB a world: the word
  sets of the window, and the budget rule's times.
- **The bare relay runs on one runtime thread** (since 2026-11-22), as
  loopguard does by default (`runtime.threads = 1`), and so does (b2).
  Before, (b) ran on `#[tokio::main]`'s multi-threaded runtime, whose
  hand-offs between threads cost more than the relaying (5.3-6.0 µs of
  CPU per message there, 2.2-2.8 µs on one thread). Every (c1)/(b) CPU
  figure dated before that change (1.38-2.35 in the table, 1.44-1.97 side
  by side) was against the slower baseline.
- **Side by side.** The table's CPU figures for (b), (b2) and (c1) come
  minutes apart, and the shared machine's state between them moved the
  (c1)/(b) ratio by up to 1.7 times over one day's runs. So the section
  after the ratios runs the three at once, subscribed to the same stream
  at the common rate: each step gives the three figures from the same
  seconds, and lasts until all three are idle again, so a relay's backlog
  counts in its step. Those figures differ from the table's (three relays
  share the CPUs and the consumer reads all their output), so compare the
  ratios, not the absolute figures, with the table's.
- **A noisy machine.** The same code ran at different speeds through
  2026-11-21: (a) sustained 727k msg/s in the morning and 419-524k in the
  evening; the mention parser, unchanged, took 91 ns, then 137-167 ns, then
  91 ns again. In one run of 2026-11-21, (c1)'s latency at 20k msg/s (p99
  13 ms, p99.9 37 ms) caught such a stretch: a (b)+(c1) run minutes later
  measured 1.48 / 1.95 ms for (c1) and 1.14 / 2.02 ms for (b). Ratios
  within one run compare; absolute figures across runs do not.
- **Release profile.** Since 2026-11-21 the release profile, which the
  benchmarks inherit, uses fat LTO and one codegen unit. A decision runs
  through serde_json, moka, aho-corasick and hashbrown; inlined across them,
  with its code laid out together, loopguard's CPU per message fell about
  10% side by side, and the single-decision tail below shrank.
- **Profile-guided build.** Since 2026-11-22 loopguard here is the binary
  `make release` builds and the image ships (`scripts/pgo.sh`): an
  instrumented build runs this workload (core NATS, then a tenth as many
  messages through JetStream) against a local nats-server, and the final
  build is laid out and inlined for what it counted. Its CPU per message
  was about a tenth lower than the plain release build's (7.5-8.8 against
  8.8-10.0 µs side by side, measured with the one-turn warm-up). It was trained on this benchmark's workload;
  a deployment's traffic differs in its mix, but runs the same code paths
  (parse, rules, routing, publish), which is what the profile orders. The
  criterion benchmarks below are of the plain release build.
- **What sets loopguard's sustained rate**: the machine. At (c1)'s
  failing rates loopguard's one runtime thread was 72-78% busy, the
  server 68-71% and the benchmark 35-38%: together 178-185% of the 2
  CPUs (the run of 12:45 UTC; in the slower run of 15:06 UTC 65-72%,
  65-75% and 30-39%; at 11:21 UTC 79-81%, 64-68% and 35-38%; at 10:12 UTC 66-77%, 63-71% and 32-37%; at 07:56 UTC 79-81%, 65-71% and 34-37%; at 06:14
  UTC 70-77%, 66-72% and 34-38%; at 05:02
  UTC 78-82%, 64-69% and 34-37%; at 03:12
  UTC 72-77%, 68-77% and 35-39%; in the slower run of 04:07, 63-66%,
  67-68% and 32-35%, with the same pattern of the three rising
  together). A second runtime thread did not help on this 2-CPU machine (tried
  before the workload fix, not since).
- **Peak RSS** is, since 2026-11-23, the kernel's high-water mark over the
  relay's whole life (VmHWM), warm-up and failed steps included; the runs
  below sampled it every 20 ms over the steps that passed only, and so
  read it low. Each world's history grows from step to step (remembered messages for parent lookups,
  the duplicate window), so it depends on which steps passed: at 05:02
  UTC 596 and 572 MiB for (c1) and (c2), about 6.1 and 5.9 KiB a world
  (at 04:07 UTC, after about 26 and 27 messages per world, 595 and 603
  MiB; at 03:12 UTC, after 22 and 27, 572 and 597 MiB). In the run of
  15:06 UTC (c1) held 811 MiB at turn 32, in the middle of the step
  between the two levels below, and (c2) 605 at turn 29 (the table's
  brackets); at 12:45 UTC (c1) 1053 MiB at turn 43 and (c2) 597 at turn
  25; at 11:21 UTC (c1) and (c2) 1049; at 10:12 UTC (c1) 1071 and
  (c2) 589; at 07:56 UTC (c1) 595 and (c2) 1071. The two levels are the
  turn, not a backlog: all 100,000 worlds hold the same number of
  messages, so their message maps and queues double in the same step, at
  about 29-32 messages a world, and resident memory goes from about 600
  MiB to about 1.05 GiB and stays there to about 58 (sampled from
  loopguard's /proc during a (c1) run of 2026-11-22: the growth is all
  anonymous heap, and follows the turn). The peak counts every step that
  passed, and a failed step before the last that passed adds its turns,
  so which level a set-up shows depends on how many steps it took. Idle
  worlds are measured on their own below; docs/operations.md gives a busy
  world's ceiling.
- **Drops**: the table's drops column is loopguard's slow-consumer count
  from the warm-up to the last step that passed (before 2026-11-23 it left
  out the warm-up and the common rate); it was 0 in every run published
  so far.
- **CPU** is read, since 2026-11-23, from each process's CPU clock in
  nanoseconds; before, from /proc's user and system times in 10 ms ticks,
  a granularity of about ±8% of the bare relay's figure over one step.
NOTES
echo
echo "## Criterion micro-benchmarks"
echo
echo "Run ended $(date -u -r "$decision" +%FT%TZ)."
echo
echo '```'
grep -E "^(approved|decision|mentions|single decisions|later decisions|state:)|time:" "$decision" | sed 's/^ *//'
echo '```'
echo
echo "Criterion's own samples (each the mean of many decisions, so no percentile of single decisions: those are the \"single decisions\" lines above), per benchmark:"
echo
echo '```'
python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("target/criterion/*/new/sample.json")):
    name = path.split("/")[2]
    d = json.load(open(path))
    per = sorted(t / i for t, i in zip(d["times"], d["iters"]))
    n = len(per)
    print(f"{name}: {n} samples, median {per[n // 2]:.0f} ns, slowest {per[-1]:.0f} ns")
PY
echo '```'
echo
cat <<'NOTES'
- **What sets the single-decision p99**: moka. Every 64th world lookup
  applies the cache's log of the last 64 reads (its LRU order and idle
  expiry) on the thread that made it (or on the first lookup 300 ms after
  its last upkeep): 64 list updates in memory mostly out of the CPU
  caches, which made that decision 4-8 µs slower (1 in 64 is 1.6% of
  decisions, so it alone sets the p99). Since 2026-11-22, when no worker
  has a message queued, a worker applies the log itself once 32 lookups
  have built up or 200 ms have passed (`Judge::upkeep`), so below
  saturation the upkeep is out of the decisions; at saturation moka still
  does it inside one. The benchmark times the same decisions both ways:
  back to back (the saturated case) and with the upkeep between them,
  untimed (a worker below saturation). In the runs of 2026-11-22 01:35,
  01:56, 02:46, 04:12, 05:03, 06:31 and 07:57 UTC: p99 5.32, 5.14, 6.05,
  5.70, 5.29, 6.12 and 5.42 µs back to back, 4.23, 3.58, 4.11, 3.98,
  3.53, 4.29 and 4.00 µs with the upkeep between; at 10:20, 10:23 and
  10:26 UTC 6.35, 5.57 and 10.39 µs back to back, 4.01, 3.96 and 6.14
  with the upkeep between; in the calm run of 11:22 UTC 5.72 and
  3.66 µs; in the run of 12:46 UTC 5.87 and 3.67 µs; in the slower run
  of 15:07 UTC 6.36 and 4.72 µs. The machine was slower at 06:31 than at 05:03,
  not the code: the code of 05:03, run in turn with the code above
  minutes later, gave 6.11 and 4.28 µs against 5.83 and 4.10. The mean cost of the upkeep is small (a few %
  of a decision) and the same either way.
- **Instructions per decision**, counted by callgrind (repeatable where
  timings are not): 60,000 decisions over 10,000 worlds with the relay's
  rules and approved events off cost 18.0k instructions each (18.9k before
  the allocation cuts and the `sha1` crate of 2026-11-22; valgrind runs
  SHA-1's portable code, so on the CPU, with its SHA extensions, the saving
  is larger: a message key takes 51 ns instead of 90). Names held inline
  (smol_str) added about 3% of instructions and saved two allocations a
  decision and 48 bytes an idle world; a search built once rather than per
  call, one clock read and two allocations fewer took 2% off again: four
  allocations a decision fewer in all. The search
  for conclusion phrases (which every message gets: the conversation state
  reads it even with the `concluded` rule off) was 4.3k of the 22.6k before
  it first looks for the phrases' longest words with one vectorised search.
- **Criterion's timings moved more than the code did** on the evening of
  2026-11-21. Builds with and without that prefilter (before LTO), run in
  turn, gave means of 4.67 and 4.54 µs with it and 4.76 and 3.55 µs without
  (approved events off), against 3.34 µs that morning. The instruction
  count, not criterion's time, is what shows that change. A run of
  2026-11-22 caught a slow stretch (the mention parser, unchanged, took
  158 ns on average; 80-91 ns on calm runs) and gave 4.31 µs; the calm
  runs of 01:35, 01:56, 02:46, 04:12, 05:03, 06:31 and 07:57 UTC
  (above), 2.36, 2.15, 2.41, 2.50, 2.37, 2.42 and 2.13 µs. The decision benchmark of `make bench` at 04:08
  UTC caught another (the parser 109 ns): 2.86 µs, p99 8.42 µs back to
  back and 5.84 with the upkeep between. Three runs of the same code
  minutes apart on 2026-11-22, after 10:00 UTC, show how far the machine
  moves: `make bench`'s own at 10:20 (parser 86 ns) gave means of 3.87,
  3.99, 5.30 and 1.70 µs for the four decision lines; a rerun at 10:23
  (parser 87 ns) 2.60, 2.45, 3.49 and 1.55; at 10:26 (parser 131 ns),
  2.31, 2.42, 3.42 and 2.06; at 11:22 (parser 85 ns), 2.15, 2.22, 3.04
  and 1.51; the run of 12:46 UTC (parser 83 ns, with the weighing of
  `state.max_bytes`), 2.34, 2.39, 3.23 and 1.49; the run of 15:07 UTC
  (parser 84 ns; a machine slow in what it shares, above), 2.51, 2.61,
  3.85 and 1.71, and a rerun of the last two minutes later, 3.69 and
  1.62. The parser's time flags stretches when the
  CPU is slow; the 10:20 run was slow in memory, not in the parser's few
  cached bytes. Callgrind, with no such noise, counted the same
  instructions a decision before and after the async-nats patch (263.9M
  and 263.6M for 12,000 decisions).
- **loopguard's optional rules** (alternation, similar, low_content, budget,
  concluded; off by default, and on in the relay benchmark's (c3) only) are measured on
  their own line above, set so that they seldom reject: the approval share
  printed before each benchmark says they did not. Since 2026-11-22 they
  cost half the instructions they did. `low_content` normalised each of its
  phrases (38 by default, up to 1,000) for every reply between agents;
  they are now reduced once, when the configuration is read. `similar`
  searched its stop words one by one and hashed words with SipHash; and
  both rules normalised the content again, where the duplicate rule's
  normalisation now serves them. Callgrind, 12,000 decisions over 2,000
  worlds: 71.3k instructions each with every optional rule on before,
  35.8k after; 16.9k and 17.0k with them off (the same path). The sketch
  of `similar` (above, under (c3)) took a decision with every optional
  rule on from 35.2k to 30.8k instructions and 15% of its first-level read
  misses (2,000 worlds, 8 messages each: windows of a few sets; the fuller
  a window, the more it saves). Its criterion mean went from 4.01 µs
  (05:03 UTC) to 3.54 and 3.60 µs (06:15 and 06:31 UTC), and to 3.17 µs
  at 07:57 UTC, after the substance and stemmer change above (its
  largest of 100 samples, printed as p99, 5.01 µs; 3.42 and 6.15 µs in
  the noisier run of 10:26, 3.04 and 5.12 µs at 11:22, 3.23 and 5.51 µs
  in the run of 12:46 UTC, 3.85 and 6.55 µs in that of 15:07 UTC).
- **One busy world** (`decision (one busy world, full windows)`, since
  2026-11-22): every message in one world, with no cooldown, so its
  windows fill: the duplicate window's 1,024 contents and each agent's
  1,000 approval times for the rate rule. Past those 1,000, the rate rule
  rejects the agent's messages after every rule before it has run (28% of
  the messages are approved: the humans' and the agents' first). The
  windows used to test each item with `now - at < length`, a subtraction
  with its overflow checks, and the rate rule counted its window item by
  item: 5.71 µs a decision with the code of 05:03 UTC. Now a window's
  start is worked out once and each item is one comparison, the rate and
  budget counts are a binary search, and the duplicate rule searches its
  window by hash and then tests the newest match's time: 1.60 µs in the
  same session, 1.54 µs at 06:31 UTC, 1.51 µs at 07:57 UTC, 2.06 µs in
  the noisier run of 10:26 (1.55 µs in the rerun of 10:23), 1.51 µs at
  11:22, 1.49 µs in the run of 12:46 UTC and 1.71 µs in that of 15:07
  UTC. (A first version of this line,
  in the make bench run of 06:15 UTC, kept the 1 s cooldown of the other
  lines, so the cooldown rule rejected nearly every agent message and the
  rate windows never filled: 1.95 µs there.)
- **The duplicate window in two queues** (2026-11-22, session 21): a
  world's content hashes and their times are kept apart, so the lookup
  scans 8 bytes an entry instead of 24 (session 20's perf profile of (c1)
  found the scan, stalled on memory, among the largest parts of
  `Judge::decide`, itself 25% of the samples). Criterion,
  the code before as a saved baseline and after, in one session: one busy
  world 1.53 → 1.46 µs (−3.9%, p = 0.00); contract rules 2.23 → 2.12 µs
  and 2.43 → 2.26 µs (events off / on; within noise, p = 0.31 and 0.82);
  optional rules on 3.43 → 3.05 µs (−10%, p = 0.00). Single decisions
  back to back, p99: 5.91 → 5.40 µs (all events on), 3.78 → 3.48 µs with
  the cache's upkeep between them. The side-by-side CPU pair (20,000
  msg/s, 3 s steps, windows of a few entries) cannot resolve a change
  this size: its (c1)/(b) medians were 4.55 before and 4.90 after, with
  its 10 ms CPU ticks. The runs of 17:08 and 17:09 UTC are the first
  make bench with it (see the first point above).
NOTES
echo
echo "## Memory per idle world (in process, no NATS)"
echo
echo "\`cargo bench --bench state_memory\`: a judge decides messages for N unique"
echo "worlds; resident growth divided by N, each size in a fresh process."
echo
cat "$memory"
cat <<'NOTES'

## Resident memory under a flood of unique worlds

`make memory` (`scripts/memory.sh`, `examples/flood.rs`) at
`state.max_worlds = 100000`: a release loopguard over NATS, flooded with
unique worlds far past `max_worlds`, then with unique agents, threads and
contents in one world. Each phase waits until loopguard has decided all
it was sent, then reads its VmRSS; time is from the flood's start.

NOTES
head -n 1 "$flood"
echo
tail -n +2 "$flood"
cat <<'NOTES'

Resident memory levels off once the cache holds `max_worlds` worlds: the
least recently used are evicted as new ones come, and within a world every
structure has its cap (docs/operations.md, Memory). The state column is
what the cache weighs (`loopguard_state_bytes`): each world weighs at
least `max_bytes / max_worlds` (here 2.7 KB), so 100,000 small worlds
fill the default 256 MiB while holding about 95 MiB. The last phases send
human messages with 256-byte ids and thread ids, which every world keeps
until its 1,024th message: bounded by `max_worlds` alone they grew to 526
MiB resident within 600,000 messages and on (a probe of 2026-11-22,
before `state.max_bytes`); now the byte bound evicts worlds and resident
memory levels off.
NOTES
echo
cat "$policy"
cat <<'NOTES'

`cargo bench --bench policy` (benches/policy.rs): a fresh loopguard for
each set-up, with its default two workers. A world's four agent messages
each wait for the answer about the one before, so with the 20 ms service
no world's last message can come out before 80 ms: (p2)'s latencies are
mostly that wait, and its rate is what 400 worlds at that pace allow.

- **Before and after the worker stopped waiting.** Until 2026-11-22 a
  worker awaited each policy answer, so one request held every world of
  that worker. The same benchmark, plain release builds, one after the
  other on 2026-11-22 (18:06 UTC the old code, 18:12 UTC the new):
  (p0) 94,251 and 94,047 agent messages a second; (p1), a service that
  answers at once, 1,313 → 37,751 (p99 1,221 → 47 ms); (p2), 20 ms, 86 →
  13,354 (p99 18,292 → 119 ms). Now a worker sends a world's request and
  goes on with other worlds, holding back only that world's later
  messages: at most 256 requests in flight and 1,024 messages held back a
  worker, past which it takes no more until answers come.
- **The breaker, the backlog cap and the waiting worlds.** Since
  2026-11-22 (session 26) each question first asks the policy subject's
  breaker whether it rests and then records how it ended (a lock and a
  lookup in a map of failing subjects, empty here), a world whose message
  waits is entered in a map the admin API reads (a lock, an insert, a
  removal), and a held-back message checks its world's share of 64. Old
  (43cf4a2) and new (97aa0b4) plain release builds, run in turn five
  times each on 2026-11-22 from 20:10 UTC: (p1) 48,110 / 41,505 /
  42,058 / 47,554 / 56,686 agent messages a second for the old code
  (median 47,554) and 38,030 / 38,240 / 56,254 / 44,899 / 43,485 for the
  new (median 43,485); (p0), with the hook off (a path these changes
  leave alone), moved from 76,197 to 114,290 over the same runs. The
  medians differ by 9%, inside the spread of either build: this benchmark
  cannot resolve the difference. By estimate (a few hundred nanoseconds a
  question, not measured alone, against a round trip of tens of
  microseconds) none of that size is expected.
NOTES
