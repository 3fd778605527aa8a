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

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

/// Upper bound of any single wait in a test.
pub const TIMEOUT: Duration = Duration::from_secs(15);

/// Awaits `fut`, failing the test instead of hanging.
pub async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
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

/// A nats-server child process, killed on drop.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// Starts a server on a port it picks itself (`-p -1`), read back from
    /// its ports file: no window in which two tests can race for a port.
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", "-1", "--ports_file_dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        let ports_file = dir.path().join(format!("nats-server_{}.ports", child.id()));
        let deadline = std::time::Instant::now() + TIMEOUT;
        let port = loop {
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
                "nats-server exited at start"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server wrote no ports file"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let server = NatsServer {
            child,
            port,
            _dir: Some(dir),
        };
        server.wait_accepting();
        server
    }

    /// Starts a server on a given `port` (to restart one where it was).
    pub fn start_on(port: u16) -> NatsServer {
        let child = Command::new(nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        let server = NatsServer {
            child,
            port,
            _dir: None,
        };
        server.wait_accepting();
        server
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
    /// Starts the binary with `url` and `extra_toml` appended to a config
    /// that otherwise holds the defaults.
    pub fn spawn(url: &str, extra_toml: &str) -> Loopguard {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("loopguard.toml");
        let mut f = std::fs::File::create(&config).expect("config file");
        writeln!(
            f,
            "{extra_toml}\n[nats]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:0\""
        )
        .unwrap();
        let log = dir.path().join("loopguard.log");
        let child = Command::new(env!("CARGO_BIN_EXE_loopguard"))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "loopguard=debug")
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "loopguard did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
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
        let nats = NatsServer::start();
        let loopguard = Loopguard::spawn(&nats.url(), extra_toml);
        let client = within("test client", async_nats::connect(nats.url()))
            .await
            .expect("test client connects");
        let mut sub = client.subscribe("chat.>").await.expect("subscribe");
        client.flush().await.expect("flush");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let subject = m.subject.to_string();
                if subject.starts_with("chat.raw.") || subject.starts_with("chat.join.") {
                    continue;
                }
                let body = serde_json::from_slice(&m.payload)
                    .unwrap_or_else(|e| panic!("loopguard published non-JSON on {subject}: {e}"));
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
        within("loopguard to become ready", async {
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
        self.client
            .publish(subject, payload)
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

/// A JSON message body with `content`.
pub fn msg(content: &str) -> Value {
    serde_json::json!({ "content": content })
}
