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

# The targets' verdicts, computed from this run's outputs (the notes below
# are written by hand for the run they name).
cell() { # the value cell of the relay table row named $1 (column $2, default 3)
  awk -F'|' -v row="$1" -v col="${2:-3}" \
    '{k=$2; gsub(/^ +| +$/, "", k); if (k == row) {v=$col; gsub(/ /, "", v); print v; exit}}' "$relay"
}
p99() { # the p99 of the decision line starting with $1
  grep -F -- "$1 (n = " "$decision" | head -1 | sed -E 's/.*, p99 ([0-9.]+) µs.*/\1/'
}
idle() { # resident bytes per idle world at $1 worlds
  awk -F'|' -v n="$1" '{w=$2; m=$3; gsub(/ /, "", w); gsub(/ /, "", m); if (w == n && m == "1") {v=$4; gsub(/ /, "", v); print v; exit}}' "$memory"
}
verdict() { # "met" if $1 $2 $3 holds (awk comparison), else "not met"
  awk -v a="$1" -v op="$2" -v b="$3" 'BEGIN {
    ok = (op == ">=") ? (a + 0 >= b + 0) : (op == "<=") ? (a + 0 <= b + 0) : (a + 0 < b + 0)
    print ((a == "" ? "not measured" : ok ? "met" : "not met"))
  }'
}
rate1=$(cell "(c1)/(b) sustained rate") rate2=$(cell "(c2)/(b) sustained rate")
cpu_table=$(cell "(c1)/(b) CPU per message") cpu_side=$(cell median 8)
between=$(p99 "single decisions, later messages, the cache's upkeep between them")
back=$(p99 "single decisions, later messages, all events on")
idle100k=$(idle 100000) idle1m=$(idle 1000000)
# Resident memory over the floods of 2x to 50x max_worlds unique worlds:
# levelled off when the largest is within a tenth of the smallest.
read -r rss_low rss_high < <(awk -F'|' '$2 ~ /unique worlds: [0-9]+x max_worlds/ && $2 !~ / 1x / {v=$6; gsub(/ /, "", v); if (lo == "" || v + 0 < lo) lo = v + 0; if (v + 0 > hi) hi = v + 0} END {print lo, hi}' "$flood")
flood_verdict=$(awk -v lo="$rss_low" -v hi="$rss_high" 'BEGIN {print ((lo != "" && hi <= lo * 1.1) ? "met" : "not met")}')
drops=$(awk -F'|' '$2 ~ /^ \(c[0-9]\) loopguard/ {v=$(NF-1); gsub(/ /, "", v); printf "%s%s", sep, v; sep=" / "}' "$relay")
drops_verdict=$(awk -v d="$drops" 'BEGIN {n = split(d, v, " / "); ok = n > 0; for (i = 1; i <= n; i++) if (v[i] != "0") ok = 0; print (ok ? "met" : "not met")}')
cat <<VERDICTS

### The targets in this run

Computed by \`scripts/bench_report.sh\` from the tables of this file (the
relay, criterion's single decisions, memory and flood sections), so they
follow each run; the notes further down are written by hand for the run
they name.

| target | measured | verdict |
|---|---|---|
| 1. (c1)/(b) sustained rate ≥ 0.90 | $rate1 | $(verdict "$rate1" ">=" 0.90) |
| 1. (c2)/(b) sustained rate ≥ 0.60 | $rate2 | $(verdict "$rate2" ">=" 0.60) |
| 2. (c1)/(b) CPU a message ≤ 1.5, side by side (median) | $cpu_side | $(verdict "$cpu_side" "<=" 1.5) |
| 2. (c1)/(b) CPU a message ≤ 1.5, the rate search's table | $cpu_table | $(verdict "$cpu_table" "<=" 1.5) |
| 3. one decision's p99 < 5 µs, as a worker makes them (the cache's upkeep between decisions, untimed) | $between µs | $(verdict "$between" "<" 5) |
| 3. the same, back to back (the upkeep inside some decisions) | $back µs | $(verdict "$back" "<" 5) |
| 4. ≤ 1 KiB an idle world, 100,000 and 1,000,000 worlds | $idle100k and $idle1m bytes | $(verdict "$(( idle100k > idle1m ? idle100k : idle1m ))" "<=" 1024) |
| 4. resident memory levels off under floods of 2x-50x \`max_worlds\` unique worlds (largest within a tenth of the smallest) | $rss_low-$rss_high MiB | $flood_verdict |
| 5. no drops in loopguard, (c1) / (c2) / (c3) | $drops | $drops_verdict |

Target 3 is met only as a worker makes its decisions, with the cache's
upkeep between them, which the benchmark leaves untimed (a worker does it
on the same thread, between messages); decisions back to back, a world's
first message (the criterion section) and human broadcasts take longer at
p99. The decision benchmark runs over 10,000 worlds, the relay over
100,000 (about a quarter more a decision: notes below). In the relay,
loopguard is the profile-guided build, trained on this workload, and (b)
and (b2) plain release builds: that favours loopguard's CPU figures by
about a tenth (notes below), so targets 1 and 2 are further off than
their ratios show.
VERDICTS
cat <<'NOTES'

### Reading the relay table

These notes are kept by hand and quote the runs they name; where they
differ from the tables above, the tables are newer. Earlier runs' figures,
and the run-by-run diary these notes used to be, are in
`git log -p docs/benchmarks.md`.

Each set-up is one process for all its steps, after an unmeasured warm-up
of eight turns of all 100,000 worlds. loopguard's output is about 1.8
copies an input (a human's message to the transcript and four inboxes, an
agent's to the inbox it mentions, a duplicate's rejection event), each
about 1.8 times the input's size; (b) relays one unchanged copy. So
(b2)/(b) is the ceiling in rate and the floor in CPU of any relay with
loopguard's output, and (a2)/(b) a rough ceiling only: its producers
format each copy in the benchmark's own process (112-114% of a CPU in its
failed steps of 2026-11-23 08:54 UTC), which may be what limits it.
(b2), `examples/copy_relay.rs`, parses nothing and holds no state (it
reads the workload's arithmetic for what loopguard decides); side by side
the benchmark checks that it published as many messages as loopguard and
as many bytes within 1% (nats-server's `/connz`), and that loopguard's
public and private copies are the ones the workload should yield: the
run fails if not. Loss
counts every copy against what the contract's rules should approve (a rule
rejecting more than the designed ~10%, or a copy too many, fails the
step); latency runs from when the producer's 1 ms schedule was due, so a
stalled producer shows (each set-up pays the rest of a tick's burst
alike); max sustained is the last rate that passed on its only try (top of
this page). Peak RSS follows the turn, and includes failed steps'
backlogs: at about 29-32 messages a world every world's maps and queues
doubled in the same step (about 600 MiB → 1.05 GiB of anonymous heap
before the two queues of 2026-11-24; (c1) and (c2) peaked at 398-425 MiB,
turns 28-35, in the 00:34 run), so its level depends on how many steps a set-up took, and the
set-ups' peaks, reached at different turns, do not compare. The table's set-ups run minutes apart on
a shared machine, which moved its (c1)/(b) CPU by up to 1.7 times in a
day; the side-by-side section is the steadier measure (compare its ratios,
not its absolute figures, with the table's: there the three relays share
the CPUs). Compare ratios within one run, never absolute figures across
runs.

- **Drops**: loopguard's slow-consumer count from the warm-up to the last
  step that passed; 0 in every run published so far.
- **CPU** comes from each process's CPU clock in nanoseconds since
  2026-11-23; before, from /proc's 10 ms ticks, about ±8% of the bare
  relay's figure over one step.

### Where the targets stand

The run of 2026-11-24 00:34 UTC (commit 11d983d: a world's
remembered messages in two queues instead of a hash map, criterion
notes), on a calm machine (the mention parser's agent path 29 ns), with a
fast bare relay ((b) 354k msg/s), which lowers every rate ratio over
(b):

1. **Rate, (c1)/(b) ≥ 0.9, (c2)/(b) ≥ 0.6: not met**, 0.39 and 0.28 ((c1)
   137k msg/s, (c2) 98k, (b) 354k), and out of reach here: (b2), a relay
   that only publishes loopguard's copies, reached 0.57 of (b)'s rate,
   (a2) 0.57; (c1) reached 0.68 of (b2)'s rate (0.64 at 23:40), and
   0.64-1.06 in the nine runs that reported it (2026-11-22 07:56 to
   2026-11-23 00:12 UTC). The machine sets the rate: at (c1)'s failing
   rates loopguard's thread, the server and the benchmark rise together
   (178-185% of the 2 CPUs at 2026-11-22 12:45 UTC); a second runtime
   thread did not help (tried before the workload fix, not since).
2. **CPU a message, (c1)/(b) ≤ 1.5: not met**, 5.49 in the table, 4.08
   side by side (4.41 at 23:40, 4.31-4.77 in the fourteen runs before):
   the lowest yet, within reach of the spread. The output alone, (b2)/(b),
   costs 1.52 side by side (1.77 in the table): the target is below what
   the output costs before any decision. The rest, (c1)/(b2) 2.74 (2.90
   at 23:40), is parsing, state and decisions (next section), and
   0.05-0.13 page faults a message (the table's last column; 0.08-0.10 at
   23:40).
3. **One decision's p99 < 5 µs, in process: met**: 4.46 µs as a worker
   makes them (the cache's upkeep between them, the pass run first, its
   worlds growing into memory the process has not mapped). In eight more
   runs of the same code (2026-11-24 00:18-00:44 UTC, the benchmark
   alone) 4.29-4.99 six times, 5.01 once, and 14.26 once, in a slow
   stretch of the machine where a page fault cost 13.5 µs at p50 (4-4.5
   in the others). 3.49% of its decisions took a page fault (4.02% at
   23:40), 81% of those over 5 µs did, and without them the p99 was 3.17
   µs. Back to back, run second: 5.87 (6.71 at 23:40); a world's first
   message 6.67 (8.12), its faults back at 0.4% (12%, criterion notes);
   busy worlds (upkeep between) p50 3.77, p99 5.34 (3.96 / 5.47).
   Criterion's means 2.64 / 2.97 / 5.28 µs (approved events off / on /
   optional rules on; 3.15 / 3.63 / 5.79 at 23:40).
4. **≤ 1 KiB per idle world, RSS levels off: met**: 757 bytes at 100,000
   and 1,000,000 worlds (886 before the two queues, 918 before the
   stamps); floods of 1x-50x `max_worlds` unique worlds levelled off at
   87.7-93.5 MiB (100.3-105.6 at 23:40).
5. **No slow-consumer drops: met**: 0.

(c3), every rule on (set to seldom reject): 0.29 of (b)'s rate, 7.41 times
its CPU in the table, 11-14 KiB a world (`similar`'s word sets, the budget
rule's times). Its relay figures move more than the optional rules cost
((c1) and (c3) alone, 2026-11-22 06:20 UTC: 12.33 against 8.50 µs, 0.90 of
the rate); the criterion figures are steadier.

Spread since 2026-11-23: the eight runs of the current benchmark (09:56,
13:40, 17:06, 19:04, 20:27, 22:22, 23:40 UTC, and 2026-11-24 00:34; the
code between the first four measured no difference, 20:27 moved the
cache's upkeep between decisions, 22:22 changed only the benchmark,
23:40 the stamps, 00:34 the two queues) and all fifteen from 2026-11-23
00:12 UTC (before 09:56 a failed rate could pass on a second try, and
CPU was in 10 ms ticks; a sixteenth, at 04:21 UTC, gave side by side
(c1)/(b) 4.21). The decision p99s before 22:22 came from the other order
of passes (criterion notes): those two rows' ranges leave 22:22 and
later out.

| measure | 00:34 | 8 runs | 15 runs |
|---|---:|---:|---:|
| (a) msg/s | 818k | 419k-818k | 396k-818k |
| (b) msg/s | 354k | 226k-395k | 202k-395k |
| (c1)/(b) rate | 0.39 | 0.31-0.61 | 0.26-0.61 |
| (c2)/(b) rate | 0.28 | 0.26-0.43 | 0.19-0.43 |
| (b2)/(b) rate | 0.57 | 0.49-0.84 | 0.44-0.85 |
| (a2)/(b) rate | 0.57 | 0.41-0.84 | 0.41-0.84 |
| (c1)/(b) CPU, table | 5.49 | 3.17-5.87 | 2.71-7.56 |
| (c1)/(b) CPU, side by side (median) | 4.08 | 4.08-4.77 | 4.08-4.77 |
| (b2)/(b) CPU, side by side | 1.52 | 1.51-1.66 | 1.50-1.76 |
| (c1)/(b2) CPU, side by side | 2.74 | 2.64-3.13 | 2.46-3.13 |
| decision p99 back to back, µs (run first until 22:22) | 5.87, run second (23:40: 6.71; 22:22: 6.57) | 6.93-8.36 | 6.93-8.69 |
| decision p99, upkeep between, µs (run second until 22:22) | 4.46, run first (23:40: 4.85; 22:22: 5.24) | 4.38-5.45 | 4.38-6.31 |
| flood level, MiB | 87.7-93.5 | 87.7-112.0 | 87.7-112.2 |
| policy (p1)/(p0); (p2)/(p0) | 0.44; 0.11 | 0.31-0.54; 0.11-0.18 | 0.31-0.54; 0.11-0.19 |

A faster machine helps the baselines more than loopguard (2026-11-23 06:50
UTC: (b) 202k → 298k msg/s, (c1) 122k → 130k; 2026-11-22 17:08 UTC: CPU a
message of (b) and (b2) -44%, of (c1) -38%; memory waits, which a faster
clock does not shorten, are a guess, not measured), so the table's ratios
swing and the side-by-side ones barely (07:32 UTC: 3.64 → 7.56 against
4.43 → 4.59); the policy ratios swing with (p0) (66k → 121k). The mention
parser's time (80-91 ns calm, 109-167 slow) flags a slow CPU, not a slow
shared machine (2026-11-22 15:06 UTC: (a) 396k msg/s against 722k, the
parser 84 ns). Latency catches such stretches too: on 2026-11-21 (c1)'s
p99 / p99.9 at 20k msg/s read 13 / 37 ms in one run, 1.48 / 1.95 ms
minutes later ((b) 1.14 / 2.02); on 2026-11-23 at 06:50 UTC (c2), at 74k
msg/s, sustained less than (c3), with more rules, at 93k.

### Where loopguard's CPU goes

`perf record -F 2000` of the profile-guided loopguard over a whole
`BENCH_ONLY=pair` run (its warm-up at 40,000 msg/s, then side by side with
(b) and (b2) at 20,000 msg/s, 100,000 worlds), 2026-11-24 01:33 UTC,
commit ccfe442; one runtime thread (97.5% of the samples on it). Beside
it, the profile of 2026-11-23 19:37 UTC (commit 500416d, 25 s of the same
run's steps, before the cache's upkeep moved between decisions and before
the two queues). Share of loopguard's samples:

| where | 2026-11-24 | 2026-11-23 |
|---|---:|---:|
| `Judge::decide` (rules, parse, routing, serialisation, inlined) | 16.7% | 20.5% |
| `Worlds::get_or_create` (the moka world lookup) | 12.3% | 9.6% |
| mimalloc's `_mi_page_malloc` | 9.3% | 8.9% |
| kernel scheduling and interrupts (`finish_task_switch`, `irqentry_exit_to_user_mode`, `_raw_spin_unlock_irqrestore`; the kernel in all 18.5% on 2026-11-24) | 10.1% | about 10% |
| `memmove` | 4.9% | 4.9% |
| async-nats's connection handler | 4.0% (+1.2% `poll_read_op`) | 3.4% (+1.0%) |
| `Worker::publish` | 3.9% | 3.5% |
| `WorldState::record_approved` | 3.8% | 5.3% |
| the intake's dispatch loop (`app::run`'s task) | 2.4% | — |
| `Egress::to_json` | 2.3% | 2.2% |
| `clock_gettime` (vDSO) | 2.1% | 1.9% |
| moka's upkeep, `do_run_pending_tasks` | 1.7% | 1.3% |
| moka's iteration for the scrape's per-state world count (`scanning_get`, `keys`, `WorldState::conversation`) | 2.1% | about 3% |

perf annotate of 2026-11-24: inside `get_or_create`, 32% of its samples
are on the load of moka's bucket pointer, 32% on the first read of the
bucket (the key compare) and 11% on the entry's expiry word: three
dependent cache misses a lookup, as the day before. Inside `decide`, the
hot instructions are each the first touch of one of the world's
allocations since its previous message: the reference-count increments
of the parent's `Arc<str>` id and of its thread id (6.7% and 4.2% of
`decide`), the newest remembered hash (4.9%, where the hash map's probe
was 12.6%), the activity window's oldest time (4.8%). A call-graph
profile of the same run (`--call-graph dwarf`, 400 Hz) puts
`_mi_page_malloc` under `Judge::deliver` (3.7% of loopguard's samples:
the private subjects 1.3%, the copies' JSON 1.0%) and under async-nats's
`HeaderMap::insert` (1.9%, which (b2) pays too), and `memmove` under the
decision (1.1%), the workers' channel (0.9%, a message's work moved in
and out) and async-nats's write buffer (1.2%). Context switches, read from
/proc in the same kind of run: about 1,000 voluntary a second for each of
(b), (b2) and (c1) at 20,000 msg/s, involuntary 100, 230 and 500.
The two pair runs of that hour, at ccfe442, gave side-by-side medians
(c1)/(b) 4.52 (under perf) and 4.01, (b2)/(b) 1.51 and 1.51, (c1)/(b2)
2.96 and 2.71: (c1)/(b2) inside the spread above (2.64-3.13), (c1)/(b)
4.52 inside it (4.08-4.77) and 4.01 just below it, the lowest yet.

With 100,000 worlds (9-11 KiB each on 2026-11-23, 0.9-1.1 GB by the
last steps; less since the two queues),
every message's world is out of the CPU caches: loopguard's cost a
message is dominated by cache misses
on its own state (moka's table and entry, the world's tables, allocator
free lists of blocks freed long before), which (b) and (b2), holding no
state, do not pay. The latest instruction and allocation cuts did not show
in the relay's CPU: the allocation cuts of the 2026-11-23 13:40 UTC
session found "no difference this benchmark resolves" (below). A layout
touching fewer cache lines a world could lower it; ids held inline did not
pay (below). Earlier profiles agree:

- 2026-11-22, loopguard alone at 40-50k msg/s: about 64% in the decision,
  18% in the NATS client's connection task, 14% allocating (in callgrind's
  cache simulation over 100,000 worlds a block off mimalloc's free list
  was 15% of first-level misses, about eight a decision); a third of
  recording an approved message (9%) was growing young worlds' maps, whose
  rehash reads every key.
- 2026-11-22, session 23, of (c1): in `decide`, an `Arc` released as an
  old entry leaves (7.0%) and the duplicate window's scan (9%, with its
  two queues), besides the parent's probe and thread-id count.
- 2026-11-23, of (c1) (the build of 96fdd85): mimalloc's fast path 10.8%,
  almost all on the load of a free block's first word.
- In process (no LTO, 2026-11-22): about 2.6 µs a decision over 1,000
  worlds (in the caches), 3.3 µs over 100,000. Since 2026-11-23 01:39 UTC
  the decision benchmark also times busy worlds at their steady state:
  about twice a young world's time.

Page faults (the side-by-side table's last column since 636fd27, from
each process's minflt in /proc): (b) and (b2) take none in the measured
steps, (c1) about a tenth a message, its worlds still growing (the
pair's steps carry each world's 9th and 10th messages; the 9th is one of
the turns where the decision benchmark's faults gather). In process a decision that
takes one costs about 2 µs more (criterion notes), so about 0.2-0.3 µs of
(c1)'s 7-10 µs a message, 3-4%. With mimalloc never giving pages back
(`MIMALLOC_PURGE_DELAY=-1`, 2026-11-23 22:00 UTC, one pair run each)
0.070-0.107 a message against 0.105-0.131, and the same CPU: most of them
are the state growing. With times kept in 8 bytes (7c8a86d), 0.083-0.098
a message at 23:40; with the remembered messages in two queues
(11d983d), 0.050-0.126 in the run above.

### What was tried, and what it measured

Changes measured in process only (the optional rules, a busy world's
windows, the duplicate window's queues) are in the criterion notes.

- 2026-11-22: async-nats keeps its connection on subjects and headers it
  cannot read (and deliveries are counted): callgrind 263.9M → 263.6M; a
  first version read headers byte by byte, 0.22 µs more CPU a message for
  any subscriber.
- 2026-11-22 12:45 UTC (4d91e52): a world weighed after each decision:
  criterion 2.15 → 2.34 µs, within that day's 2.13-2.50 for unchanged
  code; CPU side by side about 5% up, the same spread.
- 2026-11-22 after 15:06 UTC: the core intake reads its raw and join
  subscriptions in turn: side by side (c1)/(b) 4.25, 3.93 → 4.36, 4.31,
  (c1)/(b2) 2.48, 2.57 → 2.67, 2.46: within the spread of unchanged code.
- 2026-11-22, session 25, not kept: ids of up to 23 bytes inline
  (`SmolStr`): criterion -1% to +10% (short ids), -6% to +4% (36 bytes),
  inside the noise; callgrind 0.3% fewer first-level data misses, 1.5%
  more instructions (entries 8 bytes an id larger, the misses moved to the
  map's larger buckets).
- 2026-11-22 19:20 UTC (b02f010): a message waiting for the policy handed
  aside, a `Nats-Msg-Id` on every event: neither showed in CPU a message;
  (c1)/(b2) rate 0.76 → 0.67, in a run on a much slower machine, which
  does not say whether the changes or the machine did that.
- 2026-11-23 01:39 UTC (0c5e64f): a remembered message kept by a seeded
  64-bit hash of its id, no doubling of a full window, the duplicate
  window scanned 16 hashes at a time: a busy world 233 → 138 KiB resident,
  260 → 181 weighed (354 → 289 and 473 → 287 with a thread a message),
  idle world 958 → 918 bytes; callgrind 7% fewer instructions, 38% fewer
  last-level misses; busy-world p50 5.52, 5.21 → 5.09, 5.31 µs, within the
  noise. The flood with 256-byte ids holds 215.7-227.1 MiB [194.0]: the
  weights err less high.
- 2026-11-23 02:56 UTC (8883ae6): a publish keeps an owned subject and
  writes its `Nats-Msg-Id` straight into the buffer: 31.1 → 20.0 freed
  blocks a message; side by side, five runs each, (b2) 5.29 → 4.83 µs,
  (c1) 13.59 → 13.22, (b) 2.82 → 2.84 (same client); medians (b2)/(b) 1.87
  → 1.71, (c1)/(b) 4.95 → 4.65. Not kept: an approval's destinations named
  only where an event reports them, 19.9 → 17.5 freed blocks, CPU 11.13 →
  11.26 µs (noise).
- 2026-11-23 06:50 UTC (f57a4b6): a world evicted while decided is put
  back (one `contains_key` a decision): criterion within the noise (events
  off 3.81, 3.41 → 3.84, 3.45 µs; on 4.15, 3.89 → 3.96, 3.85).
- 2026-11-23 08:54 UTC (7992332): a subject's tokens found a byte at a
  time, a JSON string's tail tested as one word: callgrind -2.4% (339.7M →
  331.5M); criterion within the noise (events off 3.85, 3.56, 3.12 → 3.32,
  3.26, 3.45 µs).
- 2026-11-23 13:40 UTC (681842b): an agent's decision 13.5 → 9.5
  allocations, a human's broadcast 23 → 18 (mention lists, an inbox string
  for the event, the content's copy); criterion events off 2.93-3.23 →
  2.75-2.83 µs, on 3.73, 3.86 → 3.34, 3.46; in the relay, three runs each,
  (c1)/(b2) 2.93-3.29 → 3.03-3.31, (c1)/(b) 4.70-4.91 → 4.65-5.09: no
  difference this benchmark resolves.
- Not kept (undated): jemalloc for mimalloc (the same, loopguard alone at
  40-78k msg/s, within the noise); each id's hash kept beside it, so a
  growing message map reads no id (no faster in process).
- No cost seen: a parse error carrying its id, a speaker's key hashing its
  kind (06:50). (The JetStream worker's grace-period check, 08:54, is not
  on the relay's path: it runs core NATS with no policy hook.)
- 2026-11-23 (7cd4fda, 0655849): the world cache's upkeep applied between
  decisions at every rate, not only when the workers run dry: in process,
  in the same runs, p99 8.36 µs back to back against 5.45 with the upkeep
  between (20:27 UTC), 7.77 against 5.09 (19:51 UTC); in the relay no
  difference resolved (criterion notes).

The benchmark itself:

- 2026-11-21: turns shifted by `world % 10`, so a fifth of the traffic is
  human at any moment (before, every world's human turn came at once, and
  1-2 s of five-copy broadcasts made the failing steps and the CPU
  figure).
- 2026-11-21: fat LTO and one codegen unit: loopguard's CPU a message
  about 10% lower side by side, a shorter single-decision tail.
- 2026-11-22: (b) on one runtime thread, like loopguard and (b2): 5.3-6.0
  µs a message multi-threaded, 2.2-2.8 on one; earlier (c1)/(b) CPU
  figures (1.38-2.35 table, 1.44-1.97 side by side) were against the
  slower baseline.
- 2026-11-22: loopguard profile-guided (`scripts/pgo.sh`, as the image
  ships; trained on this workload, whose code paths other traffic shares):
  8.8-10.0 → 7.5-8.8 µs a message side by side, with the one-turn warm-up.
  Criterion stays on the plain release build.
- 2026-11-22 02:46 UTC: eight warm-up turns, not one (a world's fourth
  agent speaks by its eighth); before, rosters still filled, and CPU and
  memory read low.
- 2026-11-22 12:45 UTC: `state.max_bytes` 8 GiB: the benchmarks measure
  deciding, not evicting.
- 2026-11-22 23:59 UTC: every copy counts toward loss, a copy too many
  fails the step, latency runs from the producer's schedule.
- 2026-11-23 09:56 UTC (96fdd85): no second try ((c1)'s 122k of 08:54
  passed only on its second, p99 50.62 ms on its first); peak RSS from
  VmHWM ((c1) 910.5 MiB at turn 42, where sampling passed steps read 518.2
  at turn 25; (b)'s 96.2 MiB is failed steps' buffers); CPU from the CPU
  clock; drops from the warm-up. Then (a6ad4ab) a failed step also counts
  a lagging producer and its drain's drops; no figure moved.
- Undated in the diary: (a2) and (b2), for what the output costs alone,
  and the side-by-side pair, for CPU ratios from the same seconds.
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
  applies the cache's log of the last 64 reads (LRU order, idle expiry) on
  the thread that made it (or on the first lookup 300 ms after the last
  upkeep): 64 list updates in memory mostly out of the CPU caches, 4-8 µs
  more for that decision, and 1 in 64 (1.6%) sets the p99. Since
  2026-11-22, when no worker has a message queued, a worker applies the
  log itself once 32 lookups have built up or 200 ms have passed
  (`Judge::upkeep`): below saturation the upkeep was out of the
  decisions, at saturation moka still did it inside one. Since 2026-11-23
  (7cd4fda, 0655849) a worker also applies it after each
  decision once 32 lookups have built up (`Judge::upkeep_between`, no
  clock read otherwise), whichever path the decision came by (a new
  message, or one held back behind a policy answer), and the admin API's
  lookups count too: so at saturation too no decision applies the read
  log (moka still does after 64 writes, new worlds and re-weighings, or
  while evictions are backlogged: rarer). The same work, moved between
  decisions. So the "back to back" lines time decisions with nothing
  between them (what a saturated worker did until then), and those with
  "the cache's upkeep between them" (the busy worlds' line too, since
  then) time them as a worker now makes them at any rate;
  the upkeep's mean cost is a few % of a decision either way. In the relay
  this does not show: the decision-time histogram of (c1)'s rate search
  (builds before and after, in turn, 19:43-19:48 UTC) put 1.77% and 1.95%
  of decisions over 10 µs before, 1.32% and 2.85% after, while the
  machine slowed run by run ((c1) sustained 122k, 110k, 98k, 78k msg/s).
  The machine moves these p99s more than the code
  (2026-11-22, before the correction below: 5.14-10.39 µs back to back,
  3.53-6.14 between; at 06:31 UTC the code of 05:03, run in turn with the
  newer, gave 6.11 and 4.28 against 5.83 and 4.10), and likely a line's
  maximum too (21.9 ms at 2026-11-23 07:32 UTC, past a p99.9 of 49 µs).
- **The decision benchmark was corrected** on 2026-11-23 (00:12 UTC,
  59448b6): its rules read the real clock, so at the bench's pace an agent
  spoke again within its 1 s cooldown, and after each world's first five
  messages about 70% of the timed decisions were cheap cooldown rejections
  (its "100% approved" counted the first 50,000 decisions, and its inputs
  wrapped). Its rules now read a workload clock at 20,000 messages a
  second, each timed decision is of a new message, and the approved share
  is counted over the timed ones: earlier figures understate a decision. A
  profile of the approved path then: moka's lookup 12% (10,000 worlds of
  about 600 remembered messages), commit 10%, the world's hash maps 8%.
  Since 01:39 UTC it also times busy worlds at their steady state: about
  twice a young world's time, as each decision's reads of its world's
  windows and maps miss the caches.
- **Instructions per decision** (callgrind, repeatable where timings are
  not; 60,000 decisions over 10,000 worlds, the relay's rules, approved
  events off): 18.0k, from 18.9k before the allocation cuts and the `sha1`
  crate of 2026-11-22 (on the CPU, with its SHA extensions, a message key
  takes 51 ns instead of 90; valgrind runs portable code). Names held
  inline (smol_str) added about 3% and saved two allocations a decision
  and 48 bytes an idle world; a search built once, one clock read and two
  allocations fewer took 2% off again. The conclusion phrases' search,
  which every message gets (the conversation state reads it even with
  `concluded` off), was 4.3k of 22.6k before it first looked for the
  phrases' longest words with one vectorised search.
- **Noise**: criterion's timings move more than the code does. The same
  code's mean (approved events off) was 2.13-2.50 µs on the calm runs of
  2026-11-22 and up to 4.31 in slow stretches; over 2026-11-23 the mean
  ranged 3.03-4.97 (4.97 at 04:48 UTC, with events on 3.68), while the
  code changed little (within the noise, above); on 2026-11-21, builds with and
  without the conclusion prefilter in turn gave 4.67, 4.54 and 4.76, 3.55
  µs (3.34 that morning). The mention parser's time flags a slow CPU, not
  slow memory: at 2026-11-22 10:20 UTC (parser 86 ns) the four decision
  lines took 3.87 / 3.99 / 5.30 / 1.70 µs, minutes later 2.60 / 2.45 /
  3.49 / 1.55. The instruction count, not the time, shows a change.
- **Page faults: most of the rest of the young worlds' tail**
  (2026-11-23, from 21:30 UTC; the benchmark counts them since 395dc46,
  the thread's count read around each decision, outside its timing). A
  young world's queues and maps grow into memory the process has not
  mapped yet, and the kernel maps each page at its first touch, inside
  the decision that touches it: about 2 µs more (p50 4.3-4.7 µs for a
  decision that took a fault, 2.5-2.7 for the rest). Run first in its
  process, the upkeep-between pass takes about one fault a world over its
  twenty later messages (4.8% of its decisions); in six runs (22:22-22:55
  UTC) 85-87% of its decisions over 5 µs had taken one (56% in the
  noisiest), without them its p99 was 3.54-4.96 µs, its whole p99
  4.89-5.68. The faults gather where a world's tables grow: in one run (a
  temporary count by turn) turns 9, 15 and 17 held 4,786 of the 5,787
  decisions that took one, turn 17 being where an earlier count had found
  the decisions over 5 µs gathered (its queues growing from 16 places to
  32). Not the re-weighing that growth brings (skipping it left the count
  and the p99 as they were), nor mimalloc's purge of freed pages (10 ms by
  default; after 1 s or never, the benchmark's faults fell by 7% and the
  p99 moved less than between runs). A sidecar still growing pays these;
  one levelled off at its memory seldom does.
- **The passes' order** (changed in 395dc46): until then the
  upkeep-between pass ran second, in memory the back-to-back pass had
  mapped and its allocator kept, and took about a seventh of the faults
  the first pass takes (the pass run second now: 0.52-0.55% of its
  decisions, against 4.8%): its p99s before then (5.45 µs at 20:27 UTC,
  4.38-6.31 over 2026-11-23) are of partly reused memory, and set beside
  the back-to-back ones they mixed two effects. Without the decisions that
  took a fault, in the six runs, back to back read 6.16-6.53 µs at p99 and
  upkeep between 3.54-4.96: moka's upkeep inside every 64th decision is
  that gap.
- **Times in eight bytes** (2026-11-23, 7c8a86d): world state keeps its
  times as `clock::Stamp`, an `i64` of nanoseconds after a process-wide
  origin, where it kept 16-byte `Instant`s (each agent's last sight and
  approvals, the duplicate window, the activity, the budget's and
  `similar`'s windows). Six runs of each build, alternated (23:00-23:20
  UTC, the benchmark alone): the upkeep-between pass's decisions took a
  page fault 4.02-4.03% of the time, against 4.79-4.81%; its p99 read
  4.86-5.26 µs, three of six under 5, against 5.04-6.45, none under; a
  busy world weighs 195 KiB, not 220, its decisions' p50 3.65-5.05 µs
  against 4.01-5.24 and p99 4.88-6.81 against 5.53-6.87 (the busy
  worlds move most from run to run). A world's first message went the
  other way: p99 7.62-8.47 µs against 6.85-8.45 (all but one of those
  under 7.25). That line comes from the back-to-back pass, run second:
  12% of its first messages now take a page fault, 0.3% before, with
  mimalloc's purge off too, and why was not found; without the faults
  its p99 is 6.68-7.03, as before. (Back at 0.3-0.4% since the two
  queues, below.) In that pass too, mimalloc gives
  back the first pass's freed memory (`madvise` of 15-32 MiB, 1.2-2.4
  ms each under strace) inside a decision: its max read 1.7-4 ms, where
  it read 0.2 ms before (the purge landing elsewhere), and 0.1 ms with
  `MIMALLOC_PURGE_DELAY=-1`. A sidecar that evicts many worlds at once
  may see such a stall; not measured in the relay.
- **Where the faults come from** (`perf record -e page-faults` with call
  stacks over the single-decision passes, 2026-11-24 00:13 UTC, the code
  of ca715df, a sample of 92,000 faults): of those inside a decision,
  about half were recording an approval (the remembered messages' hash
  map doubling: the copy into its new table, the new table's control
  bytes, its allocation), a quarter the windows' queues growing (the
  duplicate window, the activity, each agent's approval times), a fifth
  an allocation of any kind that happened to open a fresh page of the
  allocator's (the event's JSON, a subject), and 1% creating a world
  (moka's entry, the world's block). So the faults follow the bytes a
  world grows by, which the next change cut.
- **Remembered messages in two queues** (2026-11-24, 11d983d): a world's
  remembered messages (for parent lookups) were a hash map from the id's
  hash to what the depth rule needs, beside a queue of the hashes in
  order for eviction: at 1,024 messages the map's table alone held 66
  KiB (2,048 buckets of 33 bytes). Now the hashes' queue and a queue of
  what is remembered, side by side, 32 bytes a message; a lookup tries
  the newest first (a reply's parent is mostly the latest message, and
  the world's latest, the usual fallback, always is) and else scans the
  hashes from the newest end as the duplicate window does, 16 at a time
  (since 358f758: it stops at the block holding the hash; before, a
  hash found far back took a second, one-by-one walk). The worst a client
  can make of it, a parent or thread that is not remembered on every
  message, is a pass over up to 1,024 hashes a lookup, which the
  duplicate window makes on every message anyway (not timed). A reused id
  is remembered again as its latest approval, in a slot of its own (the
  map kept one entry in its first place, so it went at the first
  approval's turn; now an id approved again pushes out an older message,
  as a new id does). In process (`state_memory`, the old
  binary then the new, 2026-11-24 00:16 UTC): an idle world 886 → 757
  bytes, five messages 1,952 → 1,822; a busy world talking in one thread
  126 → 65 KiB resident (164 → 94 weighed), with a thread a message 276
  → 214 (270 → 258). Three runs of each build alternated (00:18-00:21
  UTC, the decision benchmark alone): upkeep-between p99 4.87-5.14 →
  4.51-5.01 µs, p50 2.50-2.67 → 2.24-2.50; its page faults 4.03% →
  3.49% of decisions; back to back p99 6.32-7.14 → 5.89-7.06; a world's
  first message p99 7.54-8.14 → 6.75-6.99, with 0.3-0.4% of them taking a
  fault again (12% with the stamps alone: that rise came with the map's
  table sizes, and the reason within the allocator was not looked into);
  busy worlds p50 3.00-5.25 → 3.17-4.70, p99 5.14-7.40 → 4.53-6.78, a
  busy world weighing 195 → 134 KiB. In the relay run above (c1)'s
  resident peak was 425 MiB at turn 35 (783 at turn 42 at 23:40), and
  side by side (c1)/(b2) 2.74 against 2.90: within the spread of
  unchanged code (2.64-3.13), so no CPU change is claimed.
- **loopguard's optional rules** (alternation, similar, low_content,
  budget, concluded; off by default, on in the relay's (c3) only) are set
  so that they seldom reject (the approval share printed before each
  benchmark says so). On 2026-11-22 they fell from 71.3k to 35.8k
  instructions a decision, all on (16.9k and 17.0k with them off; 12,000
  decisions over 2,000 worlds): `low_content`'s phrases (38 by default, up
  to 1,000) are reduced once, at configuration, not for every reply
  between agents; `similar` no longer searches its stop words one by one
  nor hashes with SipHash; both reuse the duplicate rule's normalisation.
  From 07:20 UTC ASCII substance is cut a byte at a time and the stemmer
  is one match: 29.1k → 26.4k (20 messages a world).
- **`similar`** compares an agent message with every approved one of its
  world in the window (300 s; here 26 and more), each word set an
  allocation out of the caches by then. Since 2026-11-22 06:00 UTC each
  set carries a 64-bit sketch bounding the words two sets can share, so
  most are ruled out unread and a merge stops once the threshold is out of
  reach (a proptest holds the answers to a full count): 35.2k → 30.8k
  instructions, 15% fewer first-level read misses (8 messages a world; the
  fuller a window, the more it saves); in process (no LTO, 100,000 worlds
  of 30 messages) 7.15-7.76 → 5.96-6.08 µs with every optional rule on
  (3.4-3.9 off); criterion 4.01 → 3.54, 3.60, then 3.17 µs with the
  stemmer. A 128-bit sketch (2026-11-23 04:48 UTC, 863eabe): 3.2% of the
  workload's pairs reach a merge at the 0.99 threshold, against 11.2%;
  7.36, 7.33 → 7.10, 7.14 µs (about 3%), for 8 bytes more a set. Left out,
  within the noise or worse: a branchless merge; a lookup table of the new
  message's words; a world's sets end to end in one buffer (1.4% fewer
  first-level read misses, 5% more write misses); a binary search of the
  stop words and memchr to split words (more instructions).
- **One busy world** (since 2026-11-22): one world, no cooldown, so the
  duplicate window's 1,024 contents and each agent's 1,000 approval times
  fill, and the rate rule rejects an agent's messages after every rule
  before it has run (28% approved). A window tested each item with an
  overflow-checked `now - at < length` and the rate rule counted item by
  item: 5.71 µs. Now a window's start is worked out once and each item is
  one comparison, the rate and budget counts are a binary search, and the
  duplicate rule searches by hash and tests the newest match's time: 1.60
  µs, 1.46-2.06 in later runs (a first version kept the 1 s cooldown, so
  the windows never filled: 1.95).
- **The duplicate window in two queues** (2026-11-22, session 21): hashes
  apart from their times, so a lookup scans 8 bytes an entry, not 24
  (session 20's profile of (c1) had the scan, stalled on memory, among the
  largest parts of `Judge::decide`, itself 25% of the samples). Criterion
  against a saved baseline: one busy world 1.53 → 1.46 µs (−3.9%, p =
  0.00), optional rules on 3.43 → 3.05 (−10%, p = 0.00), the contract's
  rules 2.23 → 2.12 and 2.43 → 2.26 (within noise, p = 0.31 and 0.82);
  single decisions p99, all events on, 5.91 → 5.40 µs, 3.78 → 3.48 with
  the upkeep between. An idle world 900 → 958 bytes with it and a slot for
  a long-id latest message (40 by arithmetic, 18 not accounted for). The
  side-by-side pair, in 10 ms ticks then, could not resolve it ((c1)/(b)
  4.55 → 4.90).
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
it was sent, then reads its VmRSS; time is from the flood's start. The
last two columns are what the phase cost loopguard a message: its CPU
time (all its threads, in the kernel's 10 ms ticks) and its minor page
faults (a page touched for the first time since the process got it).

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

**Page faults once levelled off** (the columns since 2026-11-24): while
the first 100,000 worlds grow into memory the process has not touched,
0.20 faults a message; once each new world evicts one, the allocator
reuses the evicted worlds' memory, and 0.011-0.014 a message are left at
5x-50x. Those are mimalloc giving freed pages back to the kernel (10 ms
after they empty, by default) and faulting them in again on reuse: two
runs of the build before the two queues (ca715df, 2026-11-24 00:07 and
00:08 UTC), by default and with `MIMALLOC_PURGE_DELAY=-1` (never give
back): 0.012-0.014 against 0.000 at 5x-50x, and 0.056-0.082 against
0.001-0.011 after the first of the 256-byte ids' phases, for 2-35 MiB
more resident (108.9 against 106.8 MiB at 50x, 256.6 against 221.3
after the last phase) and no CPU difference the ticks resolve (8.2
against 8.6 µs a message at 50x, 7.9 against 7.0 in the last phase). At about 2 µs a fault (the decision benchmark's
figure), 0.013 a message is about 0.03 µs of a levelled-off sidecar's
7-9: the allocator's default stays, and resident memory follows the
state down when it shrinks. Unlike the relay benchmark, whose worlds
are still growing (0.08-0.10 faults a message), this is a sidecar's
steady state. The CPU a message rose from 6.2 to 7.6 µs between 2x and
50x with the same 100,000 worlds held (6.3 to 8.6 and, purge off, 6.5 to
8.2 in the two runs before the two queues); why is not looked into (the ticks are coarse, and 40 s of a shared
machine's pace moves too).
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
