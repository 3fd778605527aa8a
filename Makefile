# loopguard: `make demo` shows it cutting a loop; `make test` runs every test.
# Both install what they need (nats-server from Debian) when it is missing.

CARGO ?= cargo
NATS_SERVER ?= $(shell command -v nats-server 2>/dev/null || ls /usr/sbin/nats-server 2>/dev/null)
DEMO_LOG ?= target/demo-loopguard.log

.PHONY: all build test demo deps lint fmt clean

all: build

build:
	$(CARGO) build --bin loopguard

# nats-server: Debian's package (2.9.x), enough for core NATS. See README.
deps:
	@if [ -z "$(NATS_SERVER)" ]; then \
		echo "installing nats-server (Debian package)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq nats-server >/dev/null; \
	fi
	@command -v nats-server >/dev/null || test -x /usr/sbin/nats-server || { echo "nats-server is still missing" >&2; exit 1; }

test: deps
	$(CARGO) test --all-targets

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt

# A local nats-server on 4222 and loopguard on its defaults, then two
# scripted agents that would loop forever. Everything stops at the end.
demo: deps
	$(CARGO) build --bin loopguard --example demo
	@set -e; \
	NATS=$$(command -v nats-server || echo /usr/sbin/nats-server); \
	$$NATS -a 127.0.0.1 -p 4222 >/dev/null 2>&1 & nats_pid=$$!; \
	trap 'kill $$lg_pid $$nats_pid 2>/dev/null || true' EXIT INT TERM; \
	sleep 0.5; \
	RUST_LOG=info target/debug/loopguard 2>$(DEMO_LOG) & lg_pid=$$!; \
	sleep 0.5; \
	target/debug/examples/demo; \
	echo; echo "loopguard's log: $(DEMO_LOG)"

clean:
	$(CARGO) clean
