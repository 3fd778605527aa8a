//! The benchmarks' nats-server: on loopback, on free ports, with its
//! monitoring endpoint; `NATS_SERVER` names the binary, as for the tests
//! and scripts/deps.sh.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running nats-server: the process, its client URL and the host:port of
/// its monitoring endpoint.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub monitor: String,
}

/// Starts a nats-server that writes its ports file into `dir`, and waits
/// until it has.
pub async fn start(dir: &Path) -> Result<Server, Box<dyn std::error::Error + Send + Sync>> {
    let bin = match std::env::var("NATS_SERVER") {
        Ok(bin) => bin,
        Err(_) => ["nats-server", "/usr/sbin/nats-server"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .ok_or("nats-server not found (set NATS_SERVER)")?
            .to_string(),
    };
    let child = Command::new(&bin)
        .args([
            "-a",
            "127.0.0.1",
            "-p",
            "-1",
            "-m",
            "-1",
            "--ports_file_dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}"))?;
    let ports = dir.join(format!("nats-server_{}.ports", child.id()));
    loop {
        if let Ok(text) = std::fs::read_to_string(&ports) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                let url = v["nats"][0].as_str().ok_or("ports file")?.to_string();
                let monitor = v["monitoring"][0].as_str().ok_or("ports file")?;
                let monitor = monitor.trim_start_matches("http://").to_string();
                return Ok(Server {
                    child,
                    url,
                    monitor,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
