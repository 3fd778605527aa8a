#!/usr/bin/env bash
# Writes docs/benchmarks.md from the outputs of `make bench`.
set -euo pipefail
relay=$1 decision=$2
cat <<HEAD
# Benchmarks

Kept by \`make bench\` (last run below). Compare ratios inside one run, never
absolute numbers across runs or machines: the server, the producer, the
consumer and the relay share the same CPUs.

HEAD
cat "$relay"
echo
echo "## Criterion micro-benchmarks"
echo
echo '```'
grep -E "^(decision|mentions|single decisions)|time:" "$decision" | sed 's/^ *//'
echo '```'
