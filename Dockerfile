# syntax=docker/dockerfile:1
# loopguard container image: a static-ish Rust binary on distroless, as non-root.
#
#   docker build -t loopguard .                 # the sidecar
#   docker build -t loopguard-demo --target demo .   # the scripted demo agents
#
# Config is read from /etc/loopguard/loopguard.toml (the shipped defaults);
# mount your own there, or override keys with LOOPGUARD__SECTION__KEY.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
# The profile-guided build (scripts/pgo.sh) trains loopguard against a real
# nats-server and merges its profile with rustc's own llvm-profdata.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nats-server \
 && rm -rf /var/lib/apt/lists/* \
 && rustup component add llvm-tools
WORKDIR /src
# Dependencies first, so source edits do not refetch the registry. Every
# target Cargo.toml names must exist for cargo to read it: stubs here, one
# for each [[bench]] it declares (.dockerignore leaves the benches out) and
# for the example agent.
COPY Cargo.toml Cargo.lock ./
# async-nats with loopguard's patch (vendor/async-nats/PATCH.md).
COPY vendor ./vendor
RUN mkdir -p src examples/rust benches \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && for t in examples/demo examples/pgo_train examples/rust/agent $(awk '/^\[/ { b = ($0 == "[[bench]]") } \
        b && /^name *=/ { gsub(/^name *= *"|".*$/, ""); print "benches/" $0 }' Cargo.toml); do \
      echo 'fn main() {}' > "$t.rs"; done \
 && cargo fetch --locked
COPY src ./src
COPY examples/demo.rs examples/pgo_train.rs ./examples/
COPY benches/shared ./benches/shared
COPY scripts/pgo.sh ./scripts/
# loopguard with profile-guided optimisation (about a tenth less CPU per
# message than a plain release build; docs/benchmarks.md), then the demo.
RUN touch src/main.rs src/lib.rs examples/*.rs \
 && scripts/pgo.sh \
 && cargo build --release --locked --example demo \
 && cp target/pgo/loopguard target/release/examples/demo /usr/local/bin/

# The sidecar. distroless/cc: glibc and CA certificates, no shell, uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot AS loopguard
COPY --from=build /usr/local/bin/loopguard /usr/local/bin/loopguard
COPY config/loopguard.toml /etc/loopguard/loopguard.toml
# No transparent huge pages for this process, even where the host's setting
# is "always": faulting in 2 MiB pages stalled messages for milliseconds
# (docs/operations.md, Sizing).
ENV MIMALLOC_ALLOW_THP=0
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/loopguard"]
CMD ["--config", "/etc/loopguard/loopguard.toml"]

# The demo agents (docker-compose's `demo` service); NATS_URL picks the server.
FROM gcr.io/distroless/cc-debian12:nonroot AS demo
COPY --from=build /usr/local/bin/demo /usr/local/bin/demo
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/demo"]

# Default target: the sidecar.
FROM loopguard
