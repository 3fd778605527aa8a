//! Test harness: a real nats-server on a free port, the real `loopguard`
//! binary, and a client that records everything loopguard publishes.
//!
//! Tests never sleep to prove that something did *not* happen. Instead,
//! [`Harness::settle`] sends a barrier into a world — a message on an unknown
//! sender kind, which loopguard rejects without touching state — and waits
//! for its event. All messages of a world are decided in order by one
//! worker, and the recorder reads one connection in order, so once the
//! barrier's event is in, every output of the earlier messages is too.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

/// Upper bound of any single wait in a test. Generous: a loaded 2-core CI
/// machine running a debug build is slow, and a wait runs this long only
/// when the test is failing anyway.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Awaits `fut`, failing the test instead of hanging.
pub async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A loopback port held until the socket is dropped: bound but not
/// listening, so connections to it are refused and no other process (a
/// parallel test's server or listener) can take it meanwhile.
pub fn reserve_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(([127, 0, 0, 1], 0).into())
        .expect("a free port");
    let port = socket.local_addr().expect("its address").port();
    (socket, port)
}

fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER") {
        return PathBuf::from(p);
    }
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/usr/bin"])
    {
        let candidate = PathBuf::from(dir).join("nats-server");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("nats-server not found: run `make test`, which installs it, or set NATS_SERVER");
}

/// Removes loopguard's own variables (`LOOPGUARD…`) that the test process
/// inherited, so a stray one in a developer's or CI's environment cannot
/// change a test's configuration.
pub fn clear_loopguard_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.as_encoded_bytes().starts_with(b"LOOPGUARD") {
            cmd.env_remove(name);
        }
    }
}

/// A nats-server child process, killed on drop.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
    /// Flags it was started with, for a restart on the same port.
    extra: Vec<String>,
    /// JetStream store directory, kept across restarts.
    store: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// Starts a server on a port it picks itself (`-p -1`), read back from
    /// its ports file: no window in which two tests can race for a port.
    pub fn start() -> NatsServer {
        NatsServer::start_with(&[])
    }

    /// Like [`NatsServer::start`], with extra server flags (e.g. auth).
    pub fn start_with(extra: &[&str]) -> NatsServer {
        NatsServer::launch("-1", extra.iter().map(|s| s.to_string()).collect())
    }

    /// Starts nats-server on `port` (`-1`: one it picks) and reads the port
    /// it listens on back from its ports file. A server that cannot have
    /// the port (another process took it) fails here, saying so, rather
    /// than leaving a test talking to whatever holds the port.
    fn launch(port: &str, extra: Vec<String>) -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", port, "--ports_file_dir"])
            .arg(dir.path())
            .args(&extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        let ports_file = dir.path().join(format!("nats-server_{}.ports", child.id()));
        let deadline = std::time::Instant::now() + TIMEOUT;
        let listening: u16 = loop {
            let url = std::fs::read_to_string(&ports_file)
                .ok()
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .and_then(|v| v["nats"][0].as_str().map(str::to_owned));
            if let Some(port) = url.and_then(|u| u.rsplit(':').next().and_then(|p| p.parse().ok()))
            {
                break port;
            }
            assert!(
                child.try_wait().ok().flatten().is_none(),
                "nats-server exited at start (port {port} taken?)"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server wrote no ports file"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        if port != "-1" {
            assert_eq!(listening.to_string(), port, "nats-server on another port");
        }
        let server = NatsServer {
            child,
            port: listening,
            _dir: dir,
            extra,
            store: None,
        };
        server.wait_accepting();
        server
    }

    /// A server with JetStream on, storing in its own temporary directory.
    pub fn start_jetstream() -> NatsServer {
        let store = tempfile::tempdir().expect("store dir");
        let path = store.path().to_str().expect("utf-8 path").to_string();
        let mut server = NatsServer::start_with(&["-js", "-sd", &path]);
        server.store = Some(store);
        server
    }

    /// Stops the server and starts it again on the same port with the same
    /// flags (and so the same JetStream store).
    pub fn restart(&mut self) {
        self.stop();
        let store = self.store.take();
        *self = NatsServer::launch(&self.port.to_string(), self.extra.clone());
        self.store = store;
    }

    /// Stops the server as an operator would (SIGTERM: it saves its
    /// streams' and consumers' state before it exits) and starts it again
    /// like [`NatsServer::restart`].
    pub fn restart_after_sigterm(&mut self) {
        self.send("-TERM");
        // Bounded: a server that does not exit fails the test, not hangs CI.
        let deadline = std::time::Instant::now() + TIMEOUT;
        while self.child.try_wait().expect("nats-server waits").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not exit on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.restart();
    }

    /// Has the server read its configuration file again (SIGHUP), as
    /// `nats-server --signal reload` does.
    pub fn reload(&self) {
        self.send("-HUP");
    }

    /// Starts a server on a given `port` (to restart one where it was).
    pub fn start_on(port: u16) -> NatsServer {
        NatsServer::launch(&port.to_string(), Vec::new())
    }

    fn wait_accepting(&self) {
        let deadline = std::time::Instant::now() + TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not come up on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server without closing its connections (SIGSTOP), as a
    /// power loss or a partition leaves them: it reads and answers nothing
    /// until [`NatsServer::thaw`].
    pub fn freeze(&self) {
        self.send("-STOP");
    }

    pub fn thaw(&self) {
        self.send("-CONT");
    }

    fn send(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success(), "kill {signal} nats-server");
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running loopguard binary, killed on drop.
pub struct Loopguard {
    child: Child,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Loopguard {
    /// Starts the binary with `toml` as its config file. The NATS URL and an
    /// ephemeral HTTP port come from the environment, which also exercises
    /// the `LOOPGUARD__…` overrides in every test.
    pub fn spawn(url: &str, toml: &str) -> Loopguard {
        Loopguard::spawn_env::<&str>(url, toml, &[])
    }

    /// Like [`Loopguard::spawn`], with extra environment variables (not
    /// necessarily UTF-8).
    pub fn spawn_env<V: AsRef<std::ffi::OsStr>>(
        url: &str,
        toml: &str,
        env: &[(&str, V)],
    ) -> Loopguard {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("loopguard.toml");
        std::fs::write(&config, toml).expect("config file");
        let log = dir.path().join("loopguard.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_loopguard"));
        clear_loopguard_env(&mut cmd);
        let child = cmd
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "loopguard=debug")
            // A test holding a world behind a question never answered
            // gives the longest timeout (10 s); a loaded machine could
            // outlast it while the test sets up (fault::policy_timeout).
            .env("LOOPGUARD_TEST_POLICY_TIMEOUT_MAX_MS", "120000")
            .env("LOOPGUARD__NATS__URL", url)
            .env("LOOPGUARD__HTTP__LISTEN", "127.0.0.1:0")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("loopguard starts");
        Loopguard {
            child,
            _dir: dir,
            log,
        }
    }

    /// Like [`Loopguard::spawn`], with the config read from a pipe
    /// (`--config /dev/stdin`), written and closed at once, as
    /// `--config <(envsubst < t.toml)` gives it.
    pub fn spawn_piped(url: &str, toml: &str) -> Loopguard {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("loopguard.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_loopguard"));
        clear_loopguard_env(&mut cmd);
        let mut child = cmd
            .args(["--config", "/dev/stdin"])
            .env("RUST_LOG", "loopguard=debug")
            .env("LOOPGUARD__NATS__URL", url)
            .env("LOOPGUARD__HTTP__LISTEN", "127.0.0.1:0")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("loopguard starts");
        let mut stdin = child.stdin.take().expect("its stdin");
        stdin.write_all(toml.as_bytes()).expect("config written");
        drop(stdin);
        Loopguard {
            child,
            _dir: dir,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config file it was started with (tests may rewrite it).
    pub fn config_path(&self) -> PathBuf {
        self._dir.path().join("loopguard.toml")
    }

    /// Waits until its `/readyz` answers 200.
    pub async fn until_ready(&self) {
        until_readyz(&self.http_addr().await, 200).await;
    }

    /// Sends a signal by name (`HUP`, `TERM`, …).
    pub fn signal(&self, name: &str) {
        self.signals(&[name]);
    }

    /// Sends the signals `names` in turn, microseconds apart (one shell's
    /// built-in `kill`s, not a process each).
    pub fn signals(&self, names: &[&str]) {
        let script = names
            .iter()
            .map(|name| format!("kill -{name} $0"))
            .collect::<Vec<_>>()
            .join(" && ");
        let ok = Command::new("sh")
            .args(["-c", &script, &self.pid().to_string()])
            .status()
            .expect("sh runs");
        assert!(ok.success());
    }

    /// Waits until the log holds `count` lines containing `needle`.
    pub async fn until_logged(&self, needle: &str, count: usize) {
        within(&format!("{count} log lines with {needle:?}"), async {
            while self.logs().matches(needle).count() < count {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }

    /// What loopguard has logged so far. Its log is written by a thread of
    /// its own: a line logged before some other sign (a message, a
    /// metric) may reach the file a moment after it, so a test that needs
    /// a line waits for it ([`Loopguard::until_logged`]); lines come in the
    /// order they were logged, and all are written before loopguard exits.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit code.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        self.exited().await
    }

    /// Waits for the process to exit (after a signal sent before, or a
    /// fault).
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        within("loopguard to exit", async {
            loop {
                if let Some(status) = self.child.try_wait().expect("wait") {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }

    /// SIGKILL: no drain, no flush, no acknowledgement.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Loopguard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One message loopguard published.
#[derive(Debug, Clone)]
pub struct Received {
    pub subject: String,
    pub msg_id: Option<String>,
    pub body: Value,
    /// The body's top-level keys as sent, in order, repeats kept (`body`,
    /// parsed, keeps only the last of a repeated key).
    pub keys: Vec<String>,
}

/// The top-level keys of a JSON object, repeats kept.
struct Keys(Vec<String>);

impl<'de> serde::Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        d.deserialize_map(Visitor)
    }
}

impl Received {
    pub fn str(&self, key: &str) -> &str {
        self.body[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} is not a string in {}", self.body))
    }
}

/// What loopguard published for a batch of ingress messages, in order.
#[derive(Debug, Default)]
pub struct Outputs(pub Vec<Received>);

impl Outputs {
    fn on(&self, subject: &str) -> Vec<&Received> {
        self.0.iter().filter(|r| r.subject == subject).collect()
    }
    pub fn public(&self, world: &str) -> Vec<&Received> {
        self.on(&format!("chat.public.{world}"))
    }
    pub fn private(&self, world: &str, agent: &str) -> Vec<&Received> {
        self.on(&format!("chat.private.{world}.{agent}"))
    }
    /// Every inbox copy in `world`.
    pub fn all_private(&self, world: &str) -> Vec<&Received> {
        let prefix = format!("chat.private.{world}.");
        self.0
            .iter()
            .filter(|r| r.subject.starts_with(&prefix))
            .collect()
    }
    pub fn events(&self, world: &str) -> Vec<&Received> {
        self.on(&format!("chat.events.{world}"))
    }
    /// `key` of every event of `world`, in order.
    pub fn field(&self, world: &str, key: &str) -> Vec<Value> {
        self.events(world)
            .iter()
            .map(|e| e.body[key].clone())
            .collect()
    }

    /// The single event of `world`, asserting there is exactly one.
    pub fn event(&self, world: &str) -> &Received {
        let events = self.events(world);
        assert_eq!(events.len(), 1, "expected one event, got {events:#?}");
        events[0]
    }
}

/// A nats-server, a loopguard and a recording client.
pub struct Harness {
    pub nats: NatsServer,
    pub loopguard: Loopguard,
    pub client: async_nats::Client,
    rx: mpsc::UnboundedReceiver<Received>,
    barrier: AtomicU64,
}

impl Harness {
    /// Starts everything and waits until loopguard answers.
    pub async fn start(extra_toml: &str) -> Harness {
        Harness::start_on(NatsServer::start(), extra_toml).await
    }

    /// Like [`Harness::start`], on a server started by the caller.
    pub async fn start_on(nats: NatsServer, extra_toml: &str) -> Harness {
        let loopguard = Loopguard::spawn(&nats.url(), extra_toml);
        Harness::around(nats, loopguard).await
    }

    /// Like [`Harness::start`], around a server and a loopguard started by
    /// the caller.
    pub async fn around(nats: NatsServer, loopguard: Loopguard) -> Harness {
        let client = within("test client", async_nats::connect(nats.url()))
            .await
            .expect("test client connects");
        let mut sub = within("subscribe", client.subscribe("chat.>"))
            .await
            .expect("subscribe");
        within("flush", client.flush()).await.expect("flush");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let subject = m.subject.to_string();
                if subject.starts_with("chat.raw.") || subject.starts_with("chat.join.") {
                    continue;
                }
                let body = serde_json::from_slice(&m.payload)
                    .unwrap_or_else(|e| panic!("loopguard published non-JSON on {subject}: {e}"));
                let keys =
                    serde_json::from_slice::<Keys>(&m.payload).map_or_else(|_| Vec::new(), |k| k.0);
                let msg_id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map(|v| v.as_str().to_string());
                if tx
                    .send(Received {
                        subject,
                        msg_id,
                        body,
                        keys,
                    })
                    .is_err()
                {
                    break;
                }
            }
        });
        let mut h = Harness {
            nats,
            loopguard,
            client,
            rx,
            barrier: AtomicU64::new(0),
        };
        h.wait_ready().await;
        h
    }

    /// Sends barriers into a probe world until one comes back: loopguard is
    /// then connected and subscribed.
    async fn wait_ready(&mut self) {
        let ready = tokio::time::timeout(TIMEOUT, async {
            loop {
                let token = self.next_token();
                self.publish("chat.raw.lg-probe.sync.".to_string() + &token, Bytes::new())
                    .await;
                let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
                while let Ok(Some(r)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    if r.subject == "chat.events.lg-probe" && r.body["sender"] == token.as_str() {
                        return;
                    }
                }
            }
        })
        .await;
        assert!(
            ready.is_ok(),
            "loopguard did not become ready; its log:\n{}",
            self.loopguard.logs()
        );
        // Drop anything the probes left behind.
        while self.rx.try_recv().is_ok() {}
    }

    /// The next message loopguard published, in arrival order.
    pub async fn recv(&mut self) -> Option<Received> {
        self.rx.recv().await
    }

    fn next_token(&self) -> String {
        format!("barrier{}", self.barrier.fetch_add(1, Ordering::SeqCst))
    }

    pub async fn publish(&self, subject: String, payload: Bytes) {
        within("publish", self.client.publish(subject, payload))
            .await
            .expect("publish");
    }

    /// Publishes `payload` as sender `name` of `kind` in `world`.
    pub async fn send(&self, world: &str, kind: &str, name: &str, payload: impl Into<Bytes>) {
        self.publish(format!("chat.raw.{world}.{kind}.{name}"), payload.into())
            .await;
    }

    /// Publishes a JSON payload.
    pub async fn send_json(&self, world: &str, kind: &str, name: &str, payload: Value) {
        self.send(world, kind, name, serde_json::to_vec(&payload).unwrap())
            .await;
    }

    pub async fn join(&self, world: &str, agent: &str) {
        self.publish(format!("chat.join.{world}.{agent}"), Bytes::new())
            .await;
    }

    /// Everything loopguard published since the last settle, up to two
    /// barriers sent into `world` now, one through each subscription (raw and
    /// join are separate subscriptions, ordered only among themselves). The
    /// barriers' own events are left out.
    pub async fn settle(&mut self, world: &str) -> Outputs {
        let raw = self.next_token();
        let join = self.next_token();
        self.publish(format!("chat.raw.{world}.sync.{raw}"), Bytes::new())
            .await;
        self.publish(format!("chat.join.{world}.{join}.sync"), Bytes::new())
            .await;
        let events = format!("chat.events.{world}");
        let mut pending = vec![raw, join];
        let mut out = Vec::new();
        within(&format!("barriers {pending:?} in {world}"), async {
            while let Some(r) = self.rx.recv().await {
                if r.subject == events {
                    if let Some(i) = pending.iter().position(|t| r.body["sender"] == t.as_str()) {
                        pending.swap_remove(i);
                        if pending.is_empty() {
                            return;
                        }
                        continue;
                    }
                }
                out.push(r);
            }
            panic!("recorder stopped");
        })
        .await;
        Outputs(out)
    }
}

/// A client of `nats` as user `user` (password `pw`), as the tests'
/// servers with permissions define their users.
pub async fn connect_as(nats: &NatsServer, user: &str) -> async_nats::Client {
    within(
        "test client",
        async_nats::ConnectOptions::with_user_and_password(user.into(), "pw".into())
            .connect(nats.url()),
    )
    .await
    .expect("test client connects")
}

/// A JSON message body with `content`.
pub fn msg(content: &str) -> Value {
    serde_json::json!({ "content": content })
}

impl Loopguard {
    /// The HTTP address loopguard bound (it logs it at start-up).
    pub async fn http_addr(&self) -> String {
        within("loopguard's http address", async {
            loop {
                let found = self.logs().lines().find_map(|l| {
                    l.contains("http listening")
                        .then(|| l.split("addr=").nth(1))
                        .flatten()
                        .map(|a| {
                            a.split_whitespace()
                                .next()
                                .unwrap_or("")
                                .trim_matches('"')
                                .to_string()
                        })
                });
                if let Some(addr) = found {
                    return addr;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }
}

/// Waits until `/readyz` at `addr` answers `status`.
pub async fn until_readyz(addr: &str, status: u16) {
    within(&format!("/readyz to answer {status}"), async {
        while http(addr, "GET", "/readyz", &[]).await.0 != status {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// A minimal HTTP/1.1 exchange: (status, body).
pub async fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let (status, _, body) = http_with_head(addr, method, path, headers).await;
    (status, body)
}

/// As [`http`], with the response head too (status line and headers, as
/// sent: hyper writes header names in lower case).
pub async fn http_with_head(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    within(&format!("{method} {path}"), async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect to loopguard http");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if method == "POST"
            && !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        {
            req.push_str("Content-Length: 0\r\n");
        }
        req.push_str("\r\n");
        stream
            .write_all(req.as_bytes())
            .await
            .expect("write request");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read response");
        let text = String::from_utf8_lossy(&raw).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (status, head.to_string(), body.to_string())
    })
    .await
}

/// One scrape of `/metrics`, as (name, labels) → value.
pub struct Scrape(pub Vec<(String, std::collections::BTreeMap<String, String>, f64)>);

impl Scrape {
    pub async fn take(addr: &str) -> Scrape {
        let (status, body) = http(addr, "GET", "/metrics", &[]).await;
        assert_eq!(status, 200);
        Scrape::parse(&body)
    }

    pub fn parse(text: &str) -> Scrape {
        let mut out = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = line.rsplit_once(' ').expect("series and value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            out.push((
                name.to_string(),
                labels,
                value.parse().expect("numeric value"),
            ));
        }
        Scrape(out)
    }

    /// The value of the series `name` with exactly these labels (0 if absent).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: std::collections::BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.0
            .iter()
            .find(|(n, l, _)| n == name && *l == want)
            .map_or(0.0, |(_, _, v)| *v)
    }

    /// Every series of `name`.
    pub fn all(&self, name: &str) -> Vec<(std::collections::BTreeMap<String, String>, f64)> {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, v)| (l.clone(), *v))
            .collect()
    }
}

/// Publishes `ops` (NATS protocol lines, as bytes) from a raw connection, as
/// a client written in any language may: nats-server passes on a subject
/// that is not UTF-8, and a header block it does not read.
pub async fn publish_raw(url: &str, ops: &[u8]) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let addr = url.trim_start_matches("nats://");
    let stream = within("raw connect", tokio::net::TcpStream::connect(addr))
        .await
        .expect("raw connection");
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    within("INFO", stream.read_line(&mut line))
        .await
        .expect("INFO");
    let mut out = b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n".to_vec();
    out.extend_from_slice(ops);
    out.extend_from_slice(b"PING\r\n");
    within("raw publish", stream.get_mut().write_all(&out))
        .await
        .expect("raw publish");
    line.clear();
    within("PONG", stream.read_line(&mut line))
        .await
        .expect("PONG");
    assert_eq!(line, "PONG\r\n", "the server took the publishes");
}

/// An HPUB of `payload` with the header block `headers`.
pub fn hpub(subject: &str, headers: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut op = format!(
        "HPUB {subject} {} {}\r\n",
        headers.len(),
        headers.len() + payload.len()
    )
    .into_bytes();
    op.extend_from_slice(headers);
    op.extend_from_slice(payload);
    op.extend_from_slice(b"\r\n");
    op
}
