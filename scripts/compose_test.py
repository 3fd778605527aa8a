#!/usr/bin/env python3
"""docker-compose.yml and Dockerfile, checked without a Docker engine.

No engine runs here, so this proves what can be proved statically: every
service is there and wired to the others, every mounted file exists, the
loopguard environment is a valid configuration (`loopguard --check`), the
Prometheus config (with its alert rules) passes `promtool check config`, the
Grafana provisioning points at the dashboard, the Dockerfile is
multi-stage with a non-root runtime whose entrypoint is loopguard, and its
dependency step (stubs for the targets Cargo.toml names, then `cargo
fetch`) runs.
"""
import os
import re
import shutil
import subprocess
import sys
import tomllib
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPGUARD = os.environ.get("LOOPGUARD_BIN", os.path.join(ROOT, "target", "debug", "loopguard"))


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def ok(msg):
    print(f"ok   {msg}")


def dependency_step(dockerfile):
    """The build stage's first RUN, in a directory holding what its COPYs
    put there (Cargo.toml, Cargo.lock, vendor): its stubs must let cargo
    read the manifest, which names every [[bench]], before the sources are
    copied (.dockerignore leaves the benches out)."""
    run = next((r for r in re.findall(r"^RUN\s+((?:.*\\\n)*.*)$", dockerfile, re.M) if "cargo fetch" in r), None)
    if run is None:
        fail("the Dockerfile's build stage has no `cargo fetch` step")
    script = run.replace("\\\n", "").replace("&& cargo fetch --locked", "")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["Cargo.toml", "Cargo.lock"]:
            shutil.copy(os.path.join(ROOT, name), tmp)
        os.symlink(os.path.join(ROOT, "vendor"), os.path.join(tmp, "vendor"))
        p = subprocess.run(["sh", "-c", script], cwd=tmp, capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"the Dockerfile's dependency step failed: {p.stderr}")
        # `cargo metadata` reads a manifest without its targets; fetch is
        # the image's own step (offline, for this host: the build before
        # these tests downloaded what it needs).
        host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
        host = re.search(r"^host: (\S+)", host, re.M).group(1)
        p = subprocess.run(["cargo", "fetch", "--locked", "--offline", "--target", host],
                           cwd=tmp, capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"after the Dockerfile's stubs, cargo cannot read Cargo.toml (docker build would fail): {p.stderr}")
    ok("the Dockerfile's dependency step leaves a Cargo.toml cargo can read")


def main():
    compose = yaml.safe_load(open(os.path.join(ROOT, "docker-compose.yml")))
    services = compose["services"]
    for name in ["nats", "loopguard", "demo", "prometheus", "grafana"]:
        if name not in services:
            fail(f"docker-compose.yml has no {name} service")
    if "--jetstream" not in services["nats"]["command"]:
        fail("nats does not run with JetStream on")

    # every bind mount's host side exists; remember where each lands
    mounts = {}
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            host, container = volume.split(":")[:2]
            path = os.path.normpath(os.path.join(ROOT, host))
            if not os.path.exists(path):
                fail(f"{name} mounts {host}, which does not exist")
            mounts[(name, container)] = path
    ok("all five services present; every mounted file exists")

    # the Dockerfile has the targets compose builds
    dockerfile = open(os.path.join(ROOT, "Dockerfile")).read()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", dockerfile, re.M | re.I)
    for name in ["loopguard", "demo"]:
        target = services[name]["build"]["target"]
        if target not in stages:
            fail(f"compose builds target {target!r}, the Dockerfile has {stages}")
    if len(stages) < 3 or "build" not in stages:
        fail(f"Dockerfile is not multi-stage with a build stage: {stages}")
    runtime = dockerfile.split("AS loopguard", 1)[1].split("\nFROM", 1)[0]
    user = re.search(r"^USER\s+(\S+)", runtime, re.M)
    if not user or user.group(1).split(":")[0] in ("0", "root"):
        fail("the loopguard stage does not run as a non-root user")
    if '"/usr/local/bin/loopguard"' not in re.search(r"^ENTRYPOINT .*$", runtime, re.M).group(0):
        fail("the loopguard stage's entrypoint is not loopguard")
    if "/etc/loopguard/loopguard.toml" not in runtime:
        fail("the loopguard stage does not put its config at /etc/loopguard/loopguard.toml")
    ok(f"Dockerfile: stages {stages}, non-root user {user.group(1)}, entrypoint loopguard")
    dependency_step(dockerfile)

    # loopguard's environment and mounted config are a valid configuration
    lg = services["loopguard"]
    # The config's directory: a file mount stays on the old file when an
    # editor saves by renaming, and a reload would read that again.
    confdir = mounts.get(("loopguard", "/etc/loopguard"))
    if confdir is None or not os.path.isdir(confdir):
        fail("loopguard's config is not mounted as a directory at /etc/loopguard")
    config = os.path.join(confdir, "loopguard.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD")}
    env.update({k: str(v) for k, v in lg["environment"].items()})
    p = subprocess.run([LOOPGUARD, "--check", "--config", config], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"loopguard's compose environment is rejected: {p.stderr}")
    port = int(lg["ports"][0].split(":")[-1])
    # A demo with an open NATS, a fixed admin token and admin/admin
    # Grafana: published on the loopback only.
    for name, service in services.items():
        for published in service.get("ports", []):
            if not str(published).startswith("127.0.0.1:"):
                fail(f"{name} publishes {published} beyond this machine's loopback")
    ok("loopguard's config and LOOPGUARD__ environment pass loopguard --check")

    # Brought back after a crash, an OOM kill or a failed worker, as a
    # Deployment's pod is; given the time its drain may take before a kill.
    for name in ["nats", "loopguard"]:
        if services[name].get("restart") not in ("always", "unless-stopped"):
            fail(f"{name} has no restart policy (got {services[name].get('restart')!r})")
    with open(config, "rb") as f:
        grace = tomllib.load(f).get("shutdown", {}).get("grace_seconds", 10)
    grace = int(lg["environment"].get("LOOPGUARD__SHUTDOWN__GRACE_SECONDS", grace))
    stop = re.fullmatch(r"(\d+)s", str(lg.get("stop_grace_period", "10s")))
    if not stop or int(stop.group(1)) < grace + 3:
        fail(f"loopguard's stop_grace_period {lg.get('stop_grace_period')!r} is under its drain bound, "
             f"shutdown.grace_seconds + 3 s = {grace + 3} s")
    ok(f"nats and loopguard restart; loopguard's stop grace covers its drain ({grace} + 3 s)")

    # Prometheus: scrapes loopguard as job "loopguard", loads alerts.yml
    prom = yaml.safe_load(open(mounts[("prometheus", "/etc/prometheus/prometheus.yml")]))
    job = next((j for j in prom["scrape_configs"] if j["job_name"] == "loopguard"), None)
    if job is None or job["static_configs"][0]["targets"] != [f"loopguard:{port}"]:
        fail(f"Prometheus does not scrape loopguard:{port} as job loopguard")
    if mounts.get(("prometheus", "/etc/prometheus/alerts.yml")) != os.path.join(ROOT, "config", "prometheus", "alerts.yml"):
        fail("Prometheus does not load config/prometheus/alerts.yml")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(mounts[("prometheus", "/etc/prometheus/alerts.yml")], os.path.join(tmp, "alerts.yml"))
        prom["rule_files"] = [os.path.join(tmp, "alerts.yml")]
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(prom, f)
        p = subprocess.run(["promtool", "check", "config", os.path.join(tmp, "prometheus.yml")], capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"promtool check config: {p.stdout}{p.stderr}")
    ok("Prometheus scrapes loopguard and loads alerts.yml (promtool check config)")

    # Grafana: datasource -> prometheus service, dashboards -> the dashboard file
    prov = mounts[("grafana", "/etc/grafana/provisioning")]
    ds = yaml.safe_load(open(os.path.join(prov, "datasources", "prometheus.yml")))
    if ds["datasources"][0]["url"] != "http://prometheus:9090":
        fail("Grafana's datasource is not the prometheus service")
    dash = yaml.safe_load(open(os.path.join(prov, "dashboards", "loopguard.yml")))
    path = dash["providers"][0]["options"]["path"]
    if mounts.get(("grafana", f"{path}/loopguard.json")) != os.path.join(ROOT, "config", "grafana", "loopguard.json"):
        fail(f"Grafana's dashboard provider path {path} does not hold config/grafana/loopguard.json")
    ok("Grafana provisions the Prometheus datasource and the loopguard dashboard")
    if services["demo"]["environment"]["NATS_URL"] != "nats://nats:4222":
        fail("the demo agents do not talk to the nats service")
    # The demo waits for loopguard's /readyz at LOOPGUARD__HTTP__LISTEN
    # (its own default, 127.0.0.1, is the demo's container): the loopguard
    # service, on the port its config listens on.
    with open(os.path.join(ROOT, "config", "loopguard.toml"), "rb") as f:
        listen = tomllib.load(f)["http"]["listen"]
    port = listen.rsplit(":", 1)[1]
    # The demo resets its worlds with loopguard's admin token (a second
    # run would otherwise meet the first one's rate windows).
    if services["demo"]["environment"].get("LOOPGUARD__HTTP__ADMIN_TOKEN") != lg["environment"].get("LOOPGUARD__HTTP__ADMIN_TOKEN"):
        fail("the demo does not have loopguard's admin token")
    if services["demo"]["environment"].get("LOOPGUARD__HTTP__LISTEN") != f"loopguard:{port}":
        fail(f"the demo does not wait for the loopguard service's /readyz (loopguard:{port})")
    ok("the demo agents talk to the nats service and wait for the loopguard service")
    print("compose tests: all passed")


if __name__ == "__main__":
    main()
