//! Configuration (contract §6): a TOML file plus `LOOPGUARD__SECTION__KEY`
//! environment overrides, read through the `config` crate, then validated
//! whole before anything connects or binds.
//!
//! Every struct denies unknown fields, so a typo stops start-up with a message
//! naming the key instead of being silently ignored.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::names::Name;

/// Prefix of environment overrides; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "LOOPGUARD__";

/// Why a configuration cannot be used. Always names the key or the variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: not found")]
    Missing { path: String },
    #[error("config file {path}: {message}")]
    Unreadable { path: String, message: String },
    #[error("{0}")]
    Load(#[from] config::ConfigError),
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

/// The most a duration key that becomes a timer, a cache expiry or a
/// JetStream setting may say: ten years. Far beyond it the clocks overflow
/// (moka refuses an expiry past 1000 years; JetStream durations are
/// nanoseconds in an i64, about 292 years).
pub const MAX_SECONDS: u64 = 315_360_000;
/// Highest `rules.rate.max`.
pub const MAX_RATE: u32 = 10_000;

/// The most `nats.subscription_capacity` may say (tokio's channels refuse
/// absurd capacities); a buffer this long already holds gigabytes.
pub const MAX_SUBSCRIPTION_CAPACITY: usize = 16_777_216;

/// The longest `nats.ping_interval_seconds`: a server gone silent is
/// noticed three intervals after its last word, so past an hour it is
/// hardly noticed.
pub const MAX_PING_INTERVAL_SECONDS: u64 = 3600;

/// A server address as an error may show it: everything up to its last
/// `@` becomes `<redacted>@`, so a `user:password@` goes, even one whose
/// password holds the `/` or `#` that made the address unreadable
/// (secrets are never logged).
fn without_userinfo(address: &str) -> String {
    let (scheme, rest) = match address.split_once("://") {
        Some((scheme, rest)) => (&address[..scheme.len() + 3], rest),
        None => ("", address),
    };
    match rest.rfind('@') {
        Some(at) => format!("{scheme}<redacted>@{}", &rest[at + 1..]),
        None => address.to_string(),
    }
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// Whether rules 2-6 reject (`enforce`) or only report (`observe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Observe,
}

/// The whole configuration, as read from file and environment.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `enforce` rejects; `observe` reports what it would have rejected.
    pub mode: Mode,
    pub nats: NatsConfig,
    pub http: HttpConfig,
    pub events: EventsConfig,
    pub limits: LimitsConfig,
    pub state: StateConfig,
    pub rules: RulesConfig,
    pub shutdown: ShutdownConfig,
    pub log: LogConfig,
    pub runtime: RuntimeConfig,
    pub conversation: ConversationConfig,
    pub reload: ReloadConfig,
    /// Per-world overrides, keyed by world name. Not settable from the
    /// environment (contract §6).
    pub worlds: BTreeMap<String, WorldOverride>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Server URL(s), comma separated.
    pub url: String,
    /// Subject prefix `P` of every subject loopguard reads or writes.
    pub prefix: String,
    /// Messages buffered per subscription before the client drops them as a
    /// slow consumer. Large enough to absorb bursts while workers catch up.
    pub subscription_capacity: usize,
    /// How long the connection may go without a word from the server before
    /// the client pings it. Each further interval of silence sends another
    /// ping, and the third ends the connection with two pings unanswered.
    /// A server that stops answering without closing it (a power loss, a
    /// partition, a firewall dropping the flow) is so found out three
    /// intervals after its last word: until then loopguard reads nothing
    /// and still says it is ready.
    pub ping_interval_seconds: u64,
    /// User and password (both or neither). Credentials in `url` (a
    /// `user:password@`, or a `token@` as the NATS tools read it) are one
    /// more method, so they may not come with another.
    pub user: String,
    pub password: String,
    /// Token authentication.
    pub token: String,
    /// A `.creds` file (JWT and nkey seed), as issued by `nsc`.
    pub credentials_file: String,
    /// An nkey seed (`SU…`) for nkey authentication.
    pub nkey_seed: String,
    pub tls: TlsConfig,
    pub jetstream: JetStreamConfig,
}

/// Retention of the ingest stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    /// A message leaves the stream once loopguard acknowledges it.
    #[default]
    Workqueue,
    /// Kept by the stream's limits (age, bytes, count), e.g. for audit.
    Limits,
    /// Kept while any consumer still needs it.
    Interest,
}

/// Storage of the ingest stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    #[default]
    File,
    Memory,
}

/// No-loss ingest: capture `P.raw.>` and `P.join.>` in a JetStream stream and
/// consume it through a durable pull consumer, acknowledging a message only
/// once everything it produced has been published and flushed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JetStreamConfig {
    pub enabled: bool,
    /// Stream name; created if absent, verified (subjects) if present.
    pub stream: String,
    /// Durable consumer name.
    pub consumer: String,
    pub retention: Retention,
    pub storage: Storage,
    pub replicas: usize,
    /// Stream limits; 0 means unlimited.
    pub max_age_seconds: u64,
    pub max_bytes: u64,
    pub max_messages: u64,
    /// Time the server waits for an acknowledgement before redelivering.
    pub ack_wait_seconds: u64,
    /// Messages delivered but not yet acknowledged, at most.
    pub max_ack_pending: u64,
    /// Send copies of each egress family a stream captures whole (found at
    /// start-up) as JetStream publishes, and acknowledge the input only once
    /// the stream answered each: it has stored them. Off (the default): every
    /// copy is a core publish, confirmed by a flush, and a NATS restart can
    /// drop copies an egress stream had received but not stored.
    pub egress_acks: bool,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            enabled: false,
            stream: "LOOPGUARD_INGEST".into(),
            consumer: "loopguard".into(),
            retention: Retention::Workqueue,
            storage: Storage::File,
            replicas: 1,
            max_age_seconds: 86_400,
            max_bytes: 0,
            max_messages: 0,
            ack_wait_seconds: 30,
            max_ack_pending: 10_000,
            egress_acks: false,
        }
    }
}

impl JetStreamConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let token_ok = |s: &str| !s.is_empty() && s.bytes().all(crate::names::is_name_byte);
        if !token_ok(&self.stream) {
            return Err(invalid(
                "nats.jetstream.stream",
                "must be letters, digits, '_' or '-'",
            ));
        }
        if !token_ok(&self.consumer) {
            return Err(invalid(
                "nats.jetstream.consumer",
                "must be letters, digits, '_' or '-'",
            ));
        }
        if self.replicas == 0 || self.replicas > 5 {
            return Err(invalid("nats.jetstream.replicas", "must be 1 to 5"));
        }
        if !(1..=MAX_SECONDS).contains(&self.ack_wait_seconds) {
            return Err(invalid(
                "nats.jetstream.ack_wait_seconds",
                format!("must be 1 to {MAX_SECONDS} (ten years)"),
            ));
        }
        if self.max_age_seconds > MAX_SECONDS {
            return Err(invalid(
                "nats.jetstream.max_age_seconds",
                format!("must be 0 (unlimited) to {MAX_SECONDS} (ten years)"),
            ));
        }
        if self.max_ack_pending == 0 {
            return Err(invalid(
                "nats.jetstream.max_ack_pending",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// TLS towards NATS. Certificates are PEM files.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Require TLS even when the URL says `nats://`.
    pub required: bool,
    /// CA bundle to verify the server with (else the system roots).
    pub ca_file: String,
    /// Client certificate and key for mutual TLS (both or neither).
    pub cert_file: String,
    pub key_file: String,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("required", &self.required)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// How loopguard authenticates to NATS; secrets stay out of `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsAuth {
    None,
    UserPassword { user: String, password: String },
    Token(String),
    CredentialsFile(String),
    NkeySeed(String),
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NatsAuth::None => "None",
            NatsAuth::UserPassword { .. } => "UserPassword(<redacted>)",
            NatsAuth::Token(_) => "Token(<redacted>)",
            NatsAuth::CredentialsFile(_) => "CredentialsFile",
            NatsAuth::NkeySeed(_) => "NkeySeed(<redacted>)",
        })
    }
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: only its scheme and host are shown.
        let hosts: Vec<String> = self
            .servers()
            .map(|s| {
                s.iter()
                    .map(|a| format!("{}:{}", a.host(), a.port()))
                    .collect()
            })
            .unwrap_or_default();
        f.debug_struct("NatsConfig")
            .field("servers", &hosts)
            .field("prefix", &self.prefix)
            .field("subscription_capacity", &self.subscription_capacity)
            .field("ping_interval_seconds", &self.ping_interval_seconds)
            .field("auth", &self.auth().unwrap_or(NatsAuth::None))
            .field("tls", &self.tls)
            .field("jetstream", &self.jetstream)
            .finish()
    }
}

impl NatsConfig {
    /// The one authentication method configured, checked for consistency.
    pub fn auth(&self) -> Result<NatsAuth, ConfigError> {
        let set = |s: &str| !s.is_empty();
        // The keys of the methods set, to name them if more than one is.
        let mut keys = Vec::new();
        let mut methods = Vec::new();
        if set(&self.user) || set(&self.password) {
            if !(set(&self.user) && set(&self.password)) {
                return Err(invalid(
                    "nats.user",
                    "nats.user and nats.password go together",
                ));
            }
            keys.push("nats.user");
            methods.push(NatsAuth::UserPassword {
                user: self.user.clone(),
                password: self.password.clone(),
            });
        }
        if set(&self.token) {
            keys.push("nats.token");
            methods.push(NatsAuth::Token(self.token.clone()));
        }
        if set(&self.credentials_file) {
            keys.push("nats.credentials_file");
            methods.push(NatsAuth::CredentialsFile(self.credentials_file.clone()));
        }
        if set(&self.nkey_seed) {
            keys.push("nats.nkey_seed");
            methods.push(NatsAuth::NkeySeed(self.nkey_seed.clone()));
        }
        if let Some(method) = self.url_auth()? {
            keys.push("nats.url");
            methods.push(method);
        }
        match methods.len() {
            0 => Ok(NatsAuth::None),
            1 => Ok(methods.remove(0)),
            _ => Err(invalid(
                keys[1],
                format!(
                    "{} are set: set only one of user/password, token, credentials_file, nkey_seed and credentials in the URL",
                    keys.join(", ")
                ),
            )),
        }
    }

    /// The credentials written into `url`, which async-nats would ignore:
    /// `nats://user:password@host` (user and password), or
    /// `nats://token@host` (a token, as the NATS tools read it), each
    /// percent-decoded. One set is presented to whichever server is
    /// reached, so the servers of a list carry the same or none does.
    fn url_auth(&self) -> Result<Option<NatsAuth>, ConfigError> {
        let refuse = |why: &str| invalid("nats.url", why);
        let decode = |part: &str| {
            let decoded = percent_encoding::percent_decode_str(part)
                .decode_utf8()
                .map_err(|_| refuse("its credentials are not UTF-8 once decoded"))?;
            if decoded.chars().any(char::is_control) {
                return Err(refuse(
                    "its credentials hold a control character once decoded",
                ));
            }
            Ok(decoded.into_owned())
        };
        let mut each = Vec::new();
        for (server, written) in self.servers()?.into_iter().zip(self.url_parts()) {
            // What the address held before its last `@`, past the scheme:
            // the url crate reads `user:@` as `user@` (a token).
            let userinfo = written
                .split_once("://")
                .map_or(written, |(_, rest)| rest)
                .rsplit_once('@')
                .map(|(userinfo, _)| userinfo);
            each.push(match (server.username(), server.password()) {
                (Some(user), Some(password)) => Some(NatsAuth::UserPassword {
                    user: decode(user)?,
                    password: decode(password)?,
                }),
                (Some(_), None) if userinfo.is_some_and(|u| u.ends_with(':')) => {
                    return Err(refuse("a user with an empty password: write `user:password@`, or a token alone as `token@`"));
                }
                (Some(token), None) => Some(NatsAuth::Token(decode(token)?)),
                (None, Some(_)) => {
                    return Err(refuse("a password with no user: write `user:password@`, or a token alone as `token@`"));
                }
                (None, None) => None,
            });
        }
        let first = each.first().cloned().flatten();
        if each.iter().any(|auth| *auth != first) {
            return Err(refuse("its servers carry different credentials, or only some carry any: one set is presented to whichever server is reached, so give every server the same (or set nats.user and nats.password)"));
        }
        Ok(first)
    }

    /// Checks the one authentication method as connecting would, so that
    /// `--check` and start-up refuse what the server or the client would:
    /// a credentials file is read and parsed, a seed's checksum and type
    /// checked. Their contents are never shown. Separate from
    /// [`NatsConfig::auth`], which reads no file.
    fn validate_auth(&self) -> Result<(), ConfigError> {
        // The server compares them byte for byte, and a Secret made from a
        // file often ends in a newline: refused here, not retried for ever
        // as a failed authentication.
        for (key, secret) in [
            ("nats.user", &self.user),
            ("nats.password", &self.password),
            ("nats.token", &self.token),
            ("nats.nkey_seed", &self.nkey_seed),
        ] {
            if secret.chars().any(char::is_control) {
                return Err(invalid(
                    key,
                    "may not hold a newline or other control character (a Secret made from a file often ends in one)",
                ));
            }
        }
        match self.auth()? {
            NatsAuth::CredentialsFile(path) => {
                let contents = std::fs::read_to_string(&path).map_err(|e| {
                    invalid(
                        "nats.credentials_file",
                        format!("{path:?} cannot be read: {e}"),
                    )
                })?;
                if let Err(e) = async_nats::ConnectOptions::new().credentials(&contents) {
                    return Err(invalid(
                        "nats.credentials_file",
                        format!("{path:?} is not a credentials file: {e}"),
                    ));
                }
            }
            NatsAuth::NkeySeed(seed) => {
                let user = nkeys::KeyPair::from_seed(&seed)
                    .is_ok_and(|k| k.key_pair_type() == nkeys::KeyPairType::User);
                if !user {
                    return Err(invalid(
                        "nats.nkey_seed",
                        "is not a user nkey seed (SU…, as `nsc` or `nk -gen user` print it)",
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks the TLS files: each exists and holds what it is for (PEM
    /// certificates, a PEM private key), cert and key come together, and the
    /// key is the certificate's. The client reads them only when it
    /// connects, and retries a file it cannot use for ever, unready: found
    /// here, it is exit 2 naming the key.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        use async_nats::rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        let t = &self.tls;
        for (key, path) in [
            ("nats.tls.ca_file", &t.ca_file),
            ("nats.tls.cert_file", &t.cert_file),
            ("nats.tls.key_file", &t.key_file),
        ] {
            if !path.is_empty() && !Path::new(path).is_file() {
                return Err(invalid(key, format!("{path:?} is not a readable file")));
            }
        }
        for (key, path) in [
            ("nats.tls.ca_file", &t.ca_file),
            ("nats.tls.cert_file", &t.cert_file),
        ] {
            if path.is_empty() {
                continue;
            }
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>());
            match certs {
                Ok(certs) if !certs.is_empty() => {}
                Ok(_) => {
                    return Err(invalid(key, format!("{path:?} holds no PEM certificate")));
                }
                Err(e) => {
                    return Err(invalid(
                        key,
                        format!("{path:?} is not a PEM certificate file ({e})"),
                    ));
                }
            }
        }
        if !t.key_file.is_empty() {
            if let Err(e) = PrivateKeyDer::from_pem_file(&t.key_file) {
                return Err(invalid(
                    "nats.tls.key_file",
                    format!("{:?} holds no PEM private key ({e})", t.key_file),
                ));
            }
        }
        if t.cert_file.is_empty() != t.key_file.is_empty() {
            return Err(invalid(
                "nats.tls.cert_file",
                "nats.tls.cert_file and nats.tls.key_file go together",
            ));
        }
        if !t.cert_file.is_empty() {
            Self::check_key_pair(&t.cert_file, &t.key_file)?;
        }
        Ok(())
    }

    /// Loads the client certificate and key as the TLS client will, which
    /// checks that the key is the certificate's: a mismatch would fail
    /// every handshake, retried for ever, rather than stop start-up.
    fn check_key_pair(cert_file: &str, key_file: &str) -> Result<(), ConfigError> {
        use async_nats::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use async_nats::rustls::{crypto::ring, pki_types::pem::PemObject, sign::CertifiedKey};
        use async_nats::rustls::{Error, InconsistentKeys};
        let unreadable = |key, e: &dyn std::fmt::Display| invalid(key, e.to_string());
        let certs = CertificateDer::pem_file_iter(cert_file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| unreadable("nats.tls.cert_file", &e))?;
        let key = PrivateKeyDer::from_pem_file(key_file)
            .map_err(|e| unreadable("nats.tls.key_file", &e))?;
        CertifiedKey::from_der(certs, key, &ring::default_provider())
            .map(drop)
            .map_err(|e| match e {
                Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => invalid(
                    "nats.tls.key_file",
                    format!("{key_file:?} does not go with nats.tls.cert_file {cert_file:?}: the key is not the first certificate's"),
                ),
                e => invalid(
                    "nats.tls.key_file",
                    format!("{key_file:?} and nats.tls.cert_file {cert_file:?} cannot be used as a client certificate ({e})"),
                ),
            })
    }

    /// The server addresses of `url`: one or more, comma separated, each
    /// `nats://`, `tls://`, `ws://` or `wss://` (or bare `host:port`).
    pub fn servers(&self) -> Result<Vec<async_nats::ServerAddr>, ConfigError> {
        let mut servers = Vec::new();
        for part in self.url_parts() {
            let addr = part.parse::<async_nats::ServerAddr>().map_err(|e| {
                invalid(
                    "nats.url",
                    format!(
                        "{:?} is not a NATS server address: {e}",
                        without_userinfo(part)
                    ),
                )
            })?;
            // `nats:/host` and `nats//host:4222` parse (as host `nats`, the
            // rest a path), and a path means nothing to a NATS server: a
            // typo, refused here rather than a connection to host `nats`.
            // (A websocket address may have a path, which a proxy reads.)
            let url = addr.clone().into_inner();
            let pathless = matches!(url.scheme(), "nats" | "tls");
            if pathless
                && (!matches!(url.path(), "" | "/")
                    || url.query().is_some()
                    || url.fragment().is_some())
            {
                return Err(invalid(
                    "nats.url",
                    format!(
                        "{:?} is not a NATS server address: it has a path, query or fragment (write scheme://host:port, e.g. nats://nats:4222)",
                        without_userinfo(part)
                    ),
                ));
            }
            servers.push(addr);
        }
        if servers.is_empty() {
            return Err(invalid("nats.url", "must name at least one server"));
        }
        Ok(servers)
    }

    /// The server addresses of `url` as written, one for each of
    /// [`NatsConfig::servers`].
    fn url_parts(&self) -> impl Iterator<Item = &str> {
        self.url.split(',').map(str::trim).filter(|p| !p.is_empty())
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            prefix: "chat".into(),
            subscription_capacity: 65_536,
            ping_interval_seconds: 10,
            user: String::new(),
            password: String::new(),
            token: String::new(),
            credentials_file: String::new(),
            nkey_seed: String::new(),
            tls: TlsConfig::default(),
            jetstream: JetStreamConfig::default(),
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of the metrics, health and admin server.
    pub listen: String,
    /// Bearer token of the admin API; empty disables it (403).
    pub admin_token: String,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("listen", &self.listen)
            .field(
                "admin_token",
                &if self.admin_token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .finish()
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "0.0.0.0:9464".into(),
            admin_token: String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Publish an event for plain approvals too (edits and rejections always
    /// get one).
    pub approved: bool,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig { approved: true }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Larger payloads are rejected with rule `too_large`.
    pub max_payload_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_payload_bytes: 65_536,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// Most worlds held at once; the least recently used are evicted beyond it.
    pub max_worlds: u64,
    /// Most bytes of world state held at once (each world weighed by what
    /// it holds, and at least `max_bytes / max_worlds`); the least recently
    /// used worlds are evicted beyond it.
    pub max_bytes: u64,
    /// A world (or roster entry) untouched this long may be forgotten.
    pub idle_seconds: u64,
    /// Recent delivered messages kept per world for
    /// `GET /v1/worlds/{w}/agents/{a}/context`; 0 (the default) keeps none.
    pub context_messages: usize,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            max_worlds: 100_000,
            max_bytes: 256 << 20,
            idle_seconds: 3600,
            context_messages: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Longest time a SIGTERM drain may take before loopguard exits anyway.
    pub grace_seconds: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace_seconds: 10 }
    }
}

/// How a world's conversation state is read (`GET /v1/worlds/{w}`, the
/// `loopguard_worlds_by_state` gauge, the `concluded` rule).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConversationConfig {
    /// Activity is compared over two such windows: the last, and the one before.
    pub window_seconds: u64,
    /// Messages in the last window (from 2+ speakers) that make a world hot.
    pub hot_messages: u32,
    /// Phrases that conclude a conversation until a human speaks again
    /// (matched as whole words in the normalised content).
    pub conclusion_phrases: Vec<String>,
}

impl Default for ConversationConfig {
    fn default() -> Self {
        let phrases = [
            "thanks everyone",
            "thank you everyone",
            "thanks all",
            "thank you all",
            "that s all",
            "that is all",
            "that will be all",
            "we re done",
            "we are done",
            "all done here",
            "signing off",
            "goodbye everyone",
            "bye everyone",
            "meeting adjourned",
            "let s wrap up here",
            "case closed",
        ];
        ConversationConfig {
            window_seconds: 60,
            hot_messages: 10,
            conclusion_phrases: phrases.iter().map(|p| p.to_string()).collect(),
        }
    }
}

/// Live reload. SIGHUP always reloads; this adds a file watch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReloadConfig {
    /// Check the config file's modification time and size this often and
    /// reload when they change; 0 (the default) watches nothing.
    pub watch_seconds: u64,
}

/// Threads of the async runtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// 1: everything on one thread, which measured the least CPU per message
    /// (hand-offs between tasks cost no cross-thread wake-ups; see
    /// docs/benchmarks.md). More: a multi-threaded runtime, so the workers
    /// of different worlds decide in parallel on machines with cores to spare.
    pub threads: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { threads: 1 }
    }
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing` filter (`info`, `loopguard=debug,warn`, …); `RUST_LOG`
    /// wins when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// Limits of the loop rules (contract §5). A limit of 0 disables its rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RulesConfig {
    pub turns: TurnsLimit,
    pub depth: DepthLimit,
    pub duplicate: DuplicateLimit,
    pub cooldown: CooldownLimit,
    pub rate: RateLimit,
    pub alternation: AlternationLimit,
    pub similar: SimilarLimit,
    pub low_content: LowContentLimit,
    pub budget: BudgetLimit,
    pub concluded: ConcludedLimit,
    pub policy: PolicyHook,
}

impl RulesConfig {
    /// A rule that reads a message's substance (`low_content`, `similar`)
    /// is on: the judge works the substance out only then, and the rules
    /// test the same switches.
    pub fn reads_substance(&self) -> bool {
        self.low_content.enabled || self.similar.is_on()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TurnsLimit {
    /// Agent messages allowed between two human or system messages.
    pub max: u32,
}

impl Default for TurnsLimit {
    fn default() -> Self {
        TurnsLimit { max: 20 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DepthLimit {
    /// Deepest reply chain an agent message may extend to.
    pub max: u32,
}

impl Default for DepthLimit {
    fn default() -> Self {
        DepthLimit { max: 8 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DuplicateLimit {
    /// How long an approved message's normalised content blocks a repeat.
    pub window_seconds: u64,
}

impl Default for DuplicateLimit {
    fn default() -> Self {
        DuplicateLimit {
            window_seconds: 300,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CooldownLimit {
    /// Least time between two approved messages of one agent in one world.
    pub seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimit {
    /// Approved messages one agent may send in one world per window.
    pub max: u32,
    pub window_seconds: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            max: 10,
            window_seconds: 60,
        }
    }
}

/// Rule 7, `alternation`: speaker cycles among agents since the last human
/// or system message (A,B,A,B… or A,B,C,A,B,C…).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlternationLimit {
    /// Longest cycle looked for (2 to 8).
    pub max_period: u32,
    /// Full repetitions of a cycle after which the next message continuing
    /// it is rejected; 0 disables the rule.
    pub max_cycles: u32,
}

impl Default for AlternationLimit {
    fn default() -> Self {
        AlternationLimit {
            max_period: 3,
            max_cycles: 0,
        }
    }
}

/// Rule 8, `similar`: near-duplicates, i.e. reworded echoes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimilarLimit {
    /// Jaccard similarity of content words (0.0-1.0) at which an agent
    /// message counts as a repeat; 0 disables the rule.
    pub threshold: f64,
    /// How long an approved message can be echoed.
    pub window_seconds: u64,
}

impl Eq for SimilarLimit {}

impl SimilarLimit {
    pub fn is_on(&self) -> bool {
        self.threshold > 0.0
    }
}

impl Default for SimilarLimit {
    fn default() -> Self {
        SimilarLimit {
            threshold: 0.0,
            window_seconds: 300,
        }
    }
}

/// Rule 9, `low_content`: agent-to-agent messages without substance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LowContentLimit {
    pub enabled: bool,
    /// Fewer letters and digits than this (after normalisation) is no content.
    pub min_chars: u32,
    /// Whole messages that say nothing (compared after normalisation, with
    /// punctuation and emoji removed).
    pub phrases: crate::rules::low_content::Phrases,
}

impl Default for LowContentLimit {
    fn default() -> Self {
        let phrases = [
            "ok",
            "okay",
            "k",
            "yes",
            "yep",
            "sure",
            "thanks",
            "thank you",
            "thanks a lot",
            "ty",
            "got it",
            "noted",
            "understood",
            "agreed",
            "i agree",
            "sounds good",
            "looks good",
            "lgtm",
            "great",
            "perfect",
            "nice",
            "cool",
            "will do",
            "on it",
            "done",
            "standing by",
            "ready when you are",
            "acknowledged",
            "ack",
            "same here",
            "me too",
            "you too",
            "no problem",
            "np",
            "of course",
            "absolutely",
            "exactly",
            "indeed",
        ];
        LowContentLimit {
            enabled: false,
            min_chars: 2,
            phrases: phrases
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .into(),
        }
    }
}

/// Rule 10, `budget`: a long-window cap on agent messages per world, so a
/// slow loop under every short limit still ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetLimit {
    /// Approved agent messages per world per window; 0 disables the rule.
    pub max: u32,
    pub window_seconds: u64,
}

impl Default for BudgetLimit {
    fn default() -> Self {
        BudgetLimit {
            max: 0,
            window_seconds: 3600,
        }
    }
}

/// Rule 11, `concluded`: once a world is concluded, agents speak only when
/// mentioned, until a human speaks again.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcludedLimit {
    pub enabled: bool,
}

/// What to do when the policy service does not answer in time or answers
/// nonsense.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Deliver the message (availability first).
    #[default]
    Open,
    /// Reject the message (safety first).
    Closed,
}

/// The policy hook: after every cheap rule approved an agent message, ask an
/// external service (any language) over NATS request/reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyHook {
    /// Request subject; empty disables the hook.
    pub subject: String,
    pub timeout_ms: u64,
    pub fail: FailMode,
    /// Timeouts in a row after which the subject is not asked for a while
    /// (`breaker::REST`): its messages fail at once meanwhile. 0: always
    /// asked.
    pub trip_after: u32,
}

impl Default for PolicyHook {
    fn default() -> Self {
        PolicyHook {
            subject: String::new(),
            timeout_ms: 500,
            fail: FailMode::Open,
            trip_after: crate::breaker::TRIP_AFTER,
        }
    }
}

/// A `[worlds.NAME]` section as written: agents, and rule keys that replace
/// the global ones for that world only.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorldOverride {
    /// Agents on the world's roster from the start.
    pub agents: Vec<String>,
    /// Any subset of `[rules]`, merged over the global rules.
    pub rules: serde_json::Value,
}

/// What the pipeline uses for one world: roster seed and effective rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldSettings {
    pub agents: Vec<Name>,
    pub rules: RulesConfig,
}

/// A validated configuration with per-world settings resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    /// The global rules, as settings for worlds without a section.
    pub default_world: Arc<WorldSettings>,
    pub worlds: HashMap<Name, Arc<WorldSettings>>,
    /// `conversation.conclusion_phrases`, ready to match (built once).
    pub conclusions: crate::rules::concluded::Conclusions,
}

impl Settings {
    /// The settings in force for `world`.
    pub fn world(&self, world: &Name) -> &Arc<WorldSettings> {
        self.worlds.get(world).unwrap_or(&self.default_world)
    }
}

impl Config {
    /// Reads `path` (required when given) and the `LOOPGUARD__…` variables in
    /// `env`, then validates the result.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let known = leaf_keys();
        let (overrides, lists) = env_overrides(env, &known)?;
        // The variable that set each key, for the errors of its value.
        let set_by: HashMap<String, String> = overrides
            .iter()
            .map(|(var, _)| (env_key(var), var.clone()))
            .collect();
        let mut builder =
            config::Config::builder().add_source(config::Config::try_from(&Config::default())?);
        if let Some(path) = path {
            let unreadable = |message: String| ConfigError::Unreadable {
                path: path.display().to_string(),
                message,
            };
            if path.is_dir() {
                return Err(unreadable("is a directory, not a file".into()));
            }
            if !path.exists() {
                return Err(ConfigError::Missing {
                    path: path.display().to_string(),
                });
            }
            // Read here, once, and handed to the config crate as text: for
            // errors that name the file (the crate's own say only
            // "Permission denied"), so that a file that is not UTF-8 is
            // refused rather than read with U+FFFD in place of its bytes,
            // and so that a pipe (`--config <(envsubst < t.toml)`,
            // `/dev/stdin`), which the crate took for a missing file, is
            // read as any file is.
            let text = match std::fs::read(path) {
                Err(e) => return Err(unreadable(e.to_string())),
                Ok(bytes) => {
                    String::from_utf8(bytes).map_err(|_| unreadable("is not UTF-8 text".into()))?
                }
            };
            builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("LOOPGUARD")
                .prefix_separator("__")
                .separator("__")
                .source(Some(overrides.into_iter().collect())),
        );
        for (key, items) in lists {
            builder = builder.set_override(key, items)?;
        }
        let built = builder.build().map_err(|e| match e {
            config::ConfigError::FileParse { uri, cause } => ConfigError::Unreadable {
                path: uri
                    .or_else(|| path.map(|p| p.display().to_string()))
                    .unwrap_or_default(),
                message: without_source_lines(&cause.to_string()),
            },
            e => e.into(),
        })?;
        check_kinds(&built, &known, &set_by)?;
        let config: Config = built
            .try_deserialize()
            .map_err(|e| explained(&e, &known, path, &set_by))?;
        config.validate()
    }

    /// Checks every value and resolves per-world settings.
    pub fn validate(mut self) -> Result<Settings, ConfigError> {
        self.nats.servers()?;
        self.nats.validate_auth()?;
        self.nats.validate_tls()?;
        self.nats.jetstream.validate()?;
        validate_prefix(&self.nats.prefix)?;
        if !(1..=MAX_SUBSCRIPTION_CAPACITY).contains(&self.nats.subscription_capacity) {
            return Err(invalid(
                "nats.subscription_capacity",
                format!("must be 1 to {MAX_SUBSCRIPTION_CAPACITY}"),
            ));
        }
        // 0 would be a timer that never waits, on which the client panics.
        if !(1..=MAX_PING_INTERVAL_SECONDS).contains(&self.nats.ping_interval_seconds) {
            return Err(invalid(
                "nats.ping_interval_seconds",
                format!("must be 1 to {MAX_PING_INTERVAL_SECONDS}"),
            ));
        }
        self.http.listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "http.listen",
                format!(
                    "{:?} is not an address: {e} (write IP:port, e.g. 0.0.0.0:9464 or 127.0.0.1:9464; host names are not resolved)",
                    self.http.listen
                ),
            )
        })?;
        // A header value cannot carry a control character (a tab aside),
        // and HTTP trims spaces and tabs at its ends, so a token like that
        // could never be presented: a Secret made from a file often ends
        // in a newline.
        let token = self.http.admin_token.as_bytes();
        let control = |b: &u8| (*b < 0x20 && *b != b'\t') || *b == 0x7f;
        let blank = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
        if token.iter().any(control) || blank(token.first()) || blank(token.last()) {
            return Err(invalid(
                "http.admin_token",
                "may not hold a newline or other control character, nor begin or end with a space or tab",
            ));
        }
        if self.limits.max_payload_bytes == 0 {
            return Err(invalid("limits.max_payload_bytes", "must be at least 1"));
        }
        if self.state.max_worlds == 0 {
            return Err(invalid("state.max_worlds", "must be at least 1"));
        }
        if self.state.max_bytes < crate::state::MIN_STATE_BYTES {
            return Err(invalid(
                "state.max_bytes",
                format!(
                    "must be at least {} (16 MiB)",
                    crate::state::MIN_STATE_BYTES
                ),
            ));
        }
        if !(1..=86_400).contains(&self.conversation.window_seconds) {
            return Err(invalid("conversation.window_seconds", "must be 1 to 86400"));
        }
        if self.conversation.conclusion_phrases.len() > 1000 {
            return Err(invalid(
                "conversation.conclusion_phrases",
                "at most 1000 phrases",
            ));
        }
        if self.state.context_messages > 256 {
            return Err(invalid("state.context_messages", "must be 0 to 256"));
        }
        if !(1..=MAX_SECONDS).contains(&self.state.idle_seconds) {
            return Err(invalid(
                "state.idle_seconds",
                format!("must be 1 to {MAX_SECONDS} (ten years)"),
            ));
        }
        if self.reload.watch_seconds > 86_400 {
            return Err(invalid("reload.watch_seconds", "must be 0 (off) to 86400"));
        }
        // Trimmed here, once, for the filter `main` builds too.
        self.log.level = log_filter(&self.log.level).map_err(|e| invalid("log.level", e))?;
        validate_rules("rules", &self.rules, &self.nats.prefix)?;
        if self.runtime.threads == 0 || self.runtime.threads > 1024 {
            return Err(invalid("runtime.threads", "must be 1 to 1024"));
        }
        // Past a bound, the drain's deadline would overflow the clock (a
        // panic at start-up in JetStream mode, where `--check` said OK).
        if !(1..=MAX_SECONDS).contains(&self.shutdown.grace_seconds) {
            return Err(invalid(
                "shutdown.grace_seconds",
                format!("must be 1 to {MAX_SECONDS} (ten years)"),
            ));
        }

        let mut worlds = HashMap::new();
        for (raw, section) in &self.worlds {
            let key = format!("worlds.{raw}");
            let world = Name::parse(raw).map_err(|e| invalid(&key, format!("world name {e}")))?;
            let mut agents: Vec<Name> = Vec::new();
            for agent in &section.agents {
                let name = Name::parse(agent).map_err(|e| {
                    invalid(format!("{key}.agents"), format!("agent {agent:?} {e}"))
                })?;
                if !agents.contains(&name) {
                    agents.push(name);
                }
            }
            if agents.len() > crate::state::MAX_PINNED {
                return Err(invalid(
                    format!("{key}.agents"),
                    format!(
                        "lists {} agents; at most {} (half a world's roster of {}, so \
                         agents not listed find a place too)",
                        agents.len(),
                        crate::state::MAX_PINNED,
                        crate::state::MAX_AGENTS
                    ),
                ));
            }
            let rules = merge_rules(&self.rules, &section.rules).map_err(|(at, e)| match at {
                Some(at) => invalid(format!("{key}.rules.{at}"), e),
                None => invalid(format!("{key}.rules"), e),
            })?;
            validate_rules(&format!("{key}.rules"), &rules, &self.nats.prefix)?;
            if worlds
                .insert(world, Arc::new(WorldSettings { agents, rules }))
                .is_some()
            {
                return Err(invalid(
                    &key,
                    "world named twice (names are case-insensitive)",
                ));
            }
        }
        let default_world = Arc::new(WorldSettings {
            agents: Vec::new(),
            rules: self.rules.clone(),
        });
        let conclusions =
            crate::rules::concluded::Conclusions::new(&self.conversation.conclusion_phrases)
                .map_err(|why| invalid("conversation.conclusion_phrases", why))?;
        Ok(Settings {
            config: self,
            default_world,
            worlds,
            conclusions,
        })
    }
}

/// Checks the ranges a rule's type does not express.
fn validate_rules(key: &str, rules: &RulesConfig, prefix: &str) -> Result<(), ConfigError> {
    if !(2..=8).contains(&rules.alternation.max_period) {
        return Err(invalid(
            format!("{key}.alternation.max_period"),
            "must be 2 to 8",
        ));
    }
    if rules.alternation.max_cycles > 32 {
        return Err(invalid(
            format!("{key}.alternation.max_cycles"),
            "must be 0 to 32",
        ));
    }
    if !(0.0..=1.0).contains(&rules.similar.threshold) {
        return Err(invalid(
            format!("{key}.similar.threshold"),
            "must be 0.0 to 1.0",
        ));
    }
    let subject_ok = rules.policy.subject.is_empty()
        || rules
            .policy
            .subject
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(crate::names::is_name_byte));
    if !subject_ok {
        return Err(invalid(
            format!("{key}.policy.subject"),
            "must be dot-separated tokens of A-Z, a-z, 0-9, '_' and '-' (no wildcards)",
        ));
    }
    // A request carries the message's egress copy: on an egress subject
    // every subscriber there would read it (private ones too), and on an
    // ingress one loopguard would take its own requests in.
    let family = ["raw", "join", "public", "private", "events"]
        .into_iter()
        .find(|family| {
            let family = format!("{prefix}.{family}");
            rules.policy.subject == family
                || rules.policy.subject.starts_with(&format!("{family}."))
        });
    if let Some(family) = family {
        return Err(invalid(
            format!("{key}.policy.subject"),
            format!(
                "{:?} is among loopguard's own subjects ({prefix}.{family}.…): its requests, which carry each message, would reach that family's subscribers; choose a subject outside {prefix}.raw, .join, .public, .private and .events",
                rules.policy.subject
            ),
        ));
    }
    if !(1..=MAX_POLICY_TIMEOUT_MS).contains(&rules.policy.timeout_ms) {
        return Err(invalid(
            format!("{key}.policy.timeout_ms"),
            format!("must be 1 to {MAX_POLICY_TIMEOUT_MS}"),
        ));
    }
    if rules.policy.trip_after > 10_000 {
        return Err(invalid(
            format!("{key}.policy.trip_after"),
            "must be 0 (never rest) to 10000",
        ));
    }
    // A window of 0 holds nothing, so its rule would never reject: turned
    // off without a word. The limit is what turns a rule off (contract §5).
    for (rule, on, window) in [
        ("rate", rules.rate.max > 0, rules.rate.window_seconds),
        ("budget", rules.budget.max > 0, rules.budget.window_seconds),
        (
            "similar",
            rules.similar.threshold > 0.0,
            rules.similar.window_seconds,
        ),
    ] {
        if on && window == 0 {
            let limit = if rule == "similar" {
                "threshold"
            } else {
                "max"
            };
            return Err(invalid(
                format!("{key}.{rule}.window_seconds"),
                format!("must be at least 1 while {key}.{rule}.{limit} is above 0 (set {limit} = 0 to turn the rule off)"),
            ));
        }
    }
    // Each agent keeps its last `rate.max` approval times: 128 MiB for a
    // full roster at this bound, more than a world is weighed at under a
    // small `state.max_bytes` (start-up warns of that: heaviest_parts).
    if rules.rate.max > MAX_RATE {
        return Err(invalid(
            format!("{key}.rate.max"),
            format!("must be at most {MAX_RATE}"),
        ));
    }
    if rules.budget.max as usize > crate::state::MAX_BUDGET_WINDOW {
        return Err(invalid(
            format!("{key}.budget.max"),
            "must be at most 10000",
        ));
    }
    if rules.low_content.phrases.len() > 1000 {
        return Err(invalid(
            format!("{key}.low_content.phrases"),
            "at most 1000 phrases",
        ));
    }
    Ok(())
}

/// A log filter as loopguard reads one (`log.level`, and `RUST_LOG`), or
/// why it is refused.
///
/// The filter syntax takes no spaces around its directives: ` info` would
/// be a target to log everything of (and nothing else), `info,
/// async_nats=debug` no filter at all, and `loopguard =debug` a target
/// named `loopguard ` that nothing logs to. A YAML block scalar ends in a
/// newline too. So each directive, and each side of a target's `=level`,
/// is trimmed. And the syntax reads a bare word that is no level as a
/// target to log everything of, and nothing else: `warning` or `inof`
/// would silence loopguard, so a target takes a level here
/// (`async_nats=debug`).
pub fn log_filter(text: &str) -> Result<String, String> {
    let filter = if text.contains(char::is_whitespace) {
        text.split(',')
            .map(trim_directive)
            .collect::<Vec<_>>()
            .join(",")
    } else {
        text.to_owned()
    };
    if filter.split(',').all(str::is_empty) {
        // A filter with no directive logs nothing at all.
        return Err(format!(
            "{text:?} names no level (error, warn, info, debug, trace, off)"
        ));
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&filter) {
        return Err(format!("{filter:?} is not a log filter: {e}"));
    }
    // A span filter (`[…]`) or a target's level (`=`) aside, a directive
    // is a level: `info]` would be a target nothing logs to.
    if let Some(word) = filter
        .split(',')
        .find(|d| !d.is_empty() && !d.contains(['=', '[']) && !is_log_level(d))
    {
        return Err(format!(
            "{word:?} is not a level (error, warn, info, debug, trace, off); \
             to filter by target, give it a level (async_nats=debug)"
        ));
    }
    // Nor one after `=` (`loopguard=` would be read as trace), nor a span
    // field's empty value (`[{req=}]`), as the chart's schema refuses them.
    if let Some(directive) = filter
        .split(',')
        .find(|d| directive_level(d).is_some_and(|level| !is_log_level(level)) || d.contains("=}"))
    {
        return Err(format!(
            "{directive:?} is not a level (error, warn, info, debug, trace, off) after its `=`, \
             or holds a field with no value"
        ));
    }
    Ok(filter)
}

/// What a directive gives after its last `=` past any span filter
/// (`async_nats=debug`, `[{req=a}]=trace`): its level, if it has one.
fn directive_level(directive: &str) -> Option<&str> {
    let tail = directive
        .rfind(']')
        .map_or(directive, |end| &directive[end + 1..]);
    tail.rsplit_once('=').map(|(_, level)| level)
}

/// Whether `word` is a level in the log filter syntax.
fn is_log_level(word: &str) -> bool {
    [
        "error", "warn", "info", "debug", "trace", "off", "0", "1", "2", "3", "4", "5",
    ]
    .iter()
    .any(|l| l.eq_ignore_ascii_case(word))
}

/// One log filter directive without the whitespace the syntax would read
/// as part of a name: around it, and around the `=` before a level
/// (`loopguard = debug`). A span's field (`[{req=a b}]`) is left as given.
fn trim_directive(directive: &str) -> String {
    let directive = directive.trim();
    match directive.rsplit_once('=') {
        Some((target, level)) if is_log_level(level.trim()) => {
            format!("{}={}", target.trim_end(), level.trim())
        }
        _ => directive.to_owned(),
    }
}

/// The longest `rules.policy.timeout_ms`: a world waits that long at most
/// for an answer, holding back its later messages.
pub const MAX_POLICY_TIMEOUT_MS: u64 = 10_000;

/// The prefix is one or more subject tokens of `[A-Za-z0-9_-]`.
fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    let ok = !prefix.is_empty()
        && prefix
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(crate::names::is_name_byte));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "nats.prefix",
            format!("{prefix:?} must be dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'"),
        ))
    }
}

/// Lays a world's partial `rules` table over the global rules. An error
/// names the key at fault below `rules` (`depth.max`), when one alone
/// fails (serde's own message names none: the table is read whole).
fn merge_rules(
    global: &RulesConfig,
    patch: &serde_json::Value,
) -> Result<RulesConfig, (Option<String>, String)> {
    let read = |patch: &serde_json::Value| {
        let mut merged = serde_json::to_value(global)?;
        merge_json(&mut merged, patch);
        serde_json::from_value::<RulesConfig>(merged)
    };
    // TOML's nan and inf become null in JSON, which the merge would pass
    // over, leaving the global value in force unseen.
    let mut leaves = Vec::new();
    leaves_of(patch, &mut Vec::new(), &mut leaves);
    if let Some((path, _)) = leaves.iter().find(|(_, value)| value.is_null()) {
        return Err((
            Some(path.join(".")),
            "must be a finite number, not nan or inf".into(),
        ));
    }
    let whole = match read(patch) {
        Ok(rules) => return Ok(rules),
        Err(e) => e.to_string(),
    };
    // Only on an error: each key the section sets, alone over the global
    // rules, until one fails.
    for (path, value) in leaves {
        let alone = path.iter().rev().fold(value.clone(), |inner, key| {
            serde_json::Value::Object(serde_json::Map::from_iter([(key.clone(), inner)]))
        });
        if let Err(e) = read(&alone) {
            let message = e.to_string();
            let message = match value.as_number() {
                Some(n) if message == "invalid number" => not_held(n),
                _ => message,
            };
            return Err((Some(path.join(".")), message));
        }
    }
    Err((None, whole))
}

/// Why a number is not one an integer key holds: serde_json, with
/// `arbitrary_precision`, says only "invalid number".
fn not_held(n: &serde_json::Number) -> String {
    // As written (`arbitrary_precision`): `5.0` stays `5.0`.
    let n = n.to_string();
    if n.contains(['.', 'e', 'E']) {
        format!("must be a whole number, not {n}")
    } else if n.starts_with('-') {
        format!("must be 0 or more, not {n}")
    } else {
        format!("{n} is too large for this key")
    }
}

/// A table's values with their paths: tables opened, a list or a single
/// value each one.
fn leaves_of<'a>(
    value: &'a serde_json::Value,
    at: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, &'a serde_json::Value)>,
) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (key, inner) in map {
                at.push(key.clone());
                leaves_of(inner, at, out);
                at.pop();
            }
        }
        _ if !at.is_empty() => out.push((at.clone(), value)),
        _ => {}
    }
}

fn merge_json(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
            for (k, v) in patch {
                match base.get_mut(k) {
                    Some(slot) => merge_json(slot, v),
                    None => {
                        base.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (_, serde_json::Value::Null) => {}
        (base, patch) => *base = patch.clone(),
    }
}

/// Single values (variable, value) and lists (key, items).
type EnvOverrides = (Vec<(String, String)>, Vec<(String, Vec<String>)>);

/// The process environment as [`Config::load`] reads it: only variables
/// whose name starts with `LOOPGUARD` (any other may hold anything, bytes
/// that are not UTF-8 included, and is none of loopguard's business). One of
/// those that is not UTF-8 is refused, naming it.
pub fn environment() -> Result<Vec<(String, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (var, value) in std::env::vars_os() {
        let name = var.as_encoded_bytes();
        let ours = name.starts_with(b"LOOPGUARD")
            || name
                .get(..ENV_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX.as_bytes()));
        if !ours {
            continue;
        }
        match (var.into_string(), value.into_string()) {
            (Ok(var), Ok(value)) => vars.push((var, value)),
            (var, _) => {
                return Err(ConfigError::Env {
                    var: var.unwrap_or_else(|v| v.to_string_lossy().into_owned()),
                    message: "is not UTF-8".into(),
                })
            }
        }
    }
    Ok(vars)
}

/// The `LOOPGUARD__…` variables: those of single values, for the `config`
/// crate's environment source, and those of lists (their key and items),
/// which take a JSON array of strings. Refuses any variable that names no
/// key (the `config` crate would otherwise report the key without the
/// variable, or, for per-world sections, accept what the contract forbids),
/// and `LOOPGUARD_X__Y` or `LOOPGUARD_X_Y` (a key's name with single
/// underscores), likely typos of `LOOPGUARD__X__Y` that would otherwise be
/// ignored.
fn env_overrides(
    env: impl IntoIterator<Item = (String, String)>,
    known: &BTreeMap<String, Leaf>,
) -> Result<EnvOverrides, ConfigError> {
    let (mut kept, mut lists) = (Vec::new(), Vec::new());
    // The variable that set each key: names differ only in case past the
    // prefix, so two may name one key, and which won would be chance.
    let mut setting: HashMap<String, String> = HashMap::new();
    for (var, value) in env {
        let other_case = !var.starts_with("LOOPGUARD")
            && var
                .get(..ENV_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX));
        if other_case {
            // `environment` passes `loopguard__…` on, so that it is not
            // ignored unseen.
            return Err(ConfigError::Env {
                message: format!(
                    "settings take capitals, as in {ENV_PREFIX}{}",
                    var[ENV_PREFIX.len()..].to_ascii_uppercase()
                ),
                var,
            });
        }
        if !var.starts_with(ENV_PREFIX) {
            if var.starts_with("LOOPGUARD_") && var.contains("__") {
                return Err(ConfigError::Env {
                    message: format!(
                        "settings take two underscores after LOOPGUARD, as in {}",
                        var.replacen("LOOPGUARD_", ENV_PREFIX, 1)
                    ),
                    var,
                });
            }
            // `LOOPGUARD_NATS_URL` for `LOOPGUARD__NATS__URL`: a key's
            // name with single underscores. Other LOOPGUARD_ variables
            // (LOOPGUARD_CONFIG, Kubernetes' LOOPGUARD_SERVICE_HOST) name
            // no key and are left alone.
            if let Some(rest) = var.strip_prefix("LOOPGUARD_") {
                let flat = rest.to_ascii_lowercase();
                if let Some(key) = known.keys().find(|k| k.replace('.', "_") == flat) {
                    return Err(ConfigError::Env {
                        message: format!(
                            "settings take two underscores between sections, as in {ENV_PREFIX}{}",
                            key.to_ascii_uppercase().replace('.', "__")
                        ),
                        var,
                    });
                }
            }
            continue;
        }
        let key = env_key(&var);
        if key == "worlds" || key.starts_with("worlds.") {
            return Err(ConfigError::Env {
                var,
                message:
                    "per-world sections cannot be set from the environment; use the config file"
                        .into(),
            });
        }
        if let Some(other) = setting.insert(key.clone(), var.clone()) {
            return Err(ConfigError::Env {
                message: format!("sets `{key}`, as {other} does: set it once"),
                var,
            });
        }
        match known.get(&key) {
            None => {
                // `LOOPGUARD__RULES__TURNS_MAX`: a section boundary written
                // with one underscore.
                let flat = key.replace('.', "_");
                let message = match known.keys().find(|k| k.replace('.', "_") == flat) {
                    Some(near) => format!(
                        "no config key `{key}`; for `{near}` write {ENV_PREFIX}{}",
                        near.to_ascii_uppercase().replace('.', "__")
                    ),
                    None => format!("no config key `{key}`"),
                };
                return Err(ConfigError::Env { var, message });
            }
            Some(Leaf::List) => match serde_json::from_str::<Vec<String>>(&value) {
                Ok(items) => lists.push((key, items)),
                Err(_) => {
                    return Err(ConfigError::Env {
                        var,
                        message: format!(
                            "`{key}` is a list: a JSON array of strings, e.g. [\"one\", \"two\"]"
                        ),
                    })
                }
            },
            Some(Leaf::Value | Leaf::Integer | Leaf::Number | Leaf::Switch) => {
                kept.push((var, value))
            }
        }
    }
    Ok((kept, lists))
}

/// The dotted key a `LOOPGUARD__…` variable sets.
fn env_key(var: &str) -> String {
    let rest = var.strip_prefix(ENV_PREFIX).unwrap_or(var);
    rest.to_ascii_lowercase().replace("__", ".")
}

/// A TOML syntax error without the lines of the file it quotes: the line
/// at fault may hold a secret (an unclosed `password = "…`). What is left
/// says where and what, on one line.
fn without_source_lines(error: &str) -> String {
    let quoted = |line: &str| {
        let line = line
            .trim_start()
            .trim_start_matches(|c: char| c.is_ascii_digit());
        line.trim_start().starts_with('|')
    };
    error
        .lines()
        .filter(|line| !line.trim().is_empty() && !quoted(line))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Whether a value is one of a key's words; if not, why not.
type WordCheck = fn(&str) -> Result<(), String>;

/// Keys that hold one word of a few, each read as its type reads it.
const WORDS: [(&str, WordCheck); 5] = [
    ("mode", word::<Mode>),
    ("log.format", word::<LogFormat>),
    ("nats.jetstream.retention", word::<Retention>),
    ("nats.jetstream.storage", word::<Storage>),
    ("rules.policy.fail", word::<FailMode>),
];

/// Whether `value` is one of `T`'s words; if not, serde's message names
/// them all.
fn word<T: serde::de::DeserializeOwned>(value: &str) -> Result<(), String> {
    serde_json::from_value::<T>(serde_json::Value::String(value.into()))
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Checks what the config crate would read loosely. It takes `true`,
/// `5.7`, `-3.0` and `"no"` where a whole number is wanted, as 1, 6, an
/// error and 0, and a rule's limit of 0 turns the rule off: an integer key
/// must hold a whole number (from a variable, its digits). It takes `1`,
/// `"yes"` and `"off"` for a switch, and `true` or `"0.6"` for a number
/// (`true` as 1.0, turning `similar` on): a switch must be `true` or
/// `false`, a number a number (from a variable, `true` or `false` in any
/// case, or a number as written), as in `[worlds.*]`, which serde reads
/// strictly. And a key of a few words gets an error that names them, not
/// the type's.
fn check_kinds(
    built: &config::Config,
    known: &BTreeMap<String, Leaf>,
    set_by: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    let refuse = |key: &str, message: String| match set_by.get(key) {
        Some(var) => ConfigError::Env {
            var: var.clone(),
            message: format!("`{key}` {message}"),
        },
        None => invalid(key, message),
    };
    for (key, leaf) in known {
        let Ok(value) = built.get::<config::Value>(key) else {
            continue;
        };
        let from_env = set_by.contains_key(key);
        let wanted = match (leaf, value.kind) {
            (Leaf::Switch, config::ValueKind::Boolean(_)) => continue,
            (Leaf::Switch, config::ValueKind::String(s))
                if from_env
                    && (s.eq_ignore_ascii_case("true") || s.eq_ignore_ascii_case("false")) =>
            {
                continue
            }
            (Leaf::Switch, kind) => ("true or false", shown(kind)),
            (
                Leaf::Number,
                config::ValueKind::Float(_)
                | config::ValueKind::I64(_)
                | config::ValueKind::I128(_)
                | config::ValueKind::U64(_)
                | config::ValueKind::U128(_),
            ) => continue,
            (Leaf::Number, config::ValueKind::String(s))
                if from_env && s.parse::<f64>().is_ok_and(f64::is_finite) =>
            {
                continue
            }
            (Leaf::Number, kind) => ("a number", shown(kind)),
            (Leaf::Integer, kind) => match integer_refused(kind, from_env) {
                Some(message) => return Err(refuse(key, message)),
                None => continue,
            },
            (Leaf::Value | Leaf::List, _) => continue,
        };
        return Err(refuse(
            key,
            format!("must be {}, not {}", wanted.0, wanted.1),
        ));
    }
    for (key, check) in WORDS {
        if let Ok(config::ValueKind::String(s)) = built.get::<config::Value>(key).map(|v| v.kind) {
            check(&s).map_err(|e| refuse(key, format!("is {s:?}: {e}")))?;
        }
    }
    Ok(())
}

/// The config crate's error, with what two common mistakes need said:
/// a top-level key written after a `[table]`, which TOML puts in that
/// table ("unknown field `mode` … for key `conversation`"), and a value
/// where a table belongs, which serde names by its Rust type ("expected
/// struct TurnsLimit").
fn explained(
    e: &config::ConfigError,
    known: &BTreeMap<String, Leaf>,
    path: Option<&Path>,
    set_by: &HashMap<String, String>,
) -> ConfigError {
    let mut text = e.to_string();
    let field = text
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(field, _)| field.to_owned());
    if let Some(field) = field.filter(|f| known.contains_key(f) && text.contains(" for key `")) {
        text = format!(
            "{text} (`{field}` is a top-level key: in TOML a key after a [section] header belongs to that section, so write it above the first one)"
        );
    } else if let Some((before, after)) = text.split_once("expected struct ") {
        let rest = after.split_once(' ').map_or("", |(_, rest)| rest);
        text = format!("{before}expected a table (a [section] of its own keys) {rest}");
    }
    // The file is read as text (see `load`), so the crate's errors name no
    // file: say which, unless the key came from the environment.
    let key = text
        .rsplit_once(" for key `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(key, _)| key.to_owned());
    if let (Some(path), Some(key)) = (path, key) {
        if !set_by.contains_key(&key) {
            text = format!("{text} in {}", path.display());
        }
    }
    ConfigError::Load(config::ConfigError::Message(text))
}

/// A value as an error names it: a string quoted.
fn shown(kind: config::ValueKind) -> String {
    match kind {
        config::ValueKind::String(s) => format!("{s:?}"),
        // `5.0` as `5.0`, not `5` (the crate's own display).
        config::ValueKind::Float(f) => format!("{f:?}"),
        other => other.to_string(),
    }
}

/// Why what an integer key holds is refused; none if it is a whole number
/// of 0 or more (from a variable, its digits). Every integer key is
/// unsigned; one past `u32` for a `u32` key is left to the reading's error.
fn integer_refused(kind: config::ValueKind, from_env: bool) -> Option<String> {
    let whole = |n: i128| {
        if n < 0 {
            Some(format!("must be 0 or more, not {n}"))
        } else if n > i128::from(u64::MAX) {
            Some(format!("{n} is too large for this key"))
        } else {
            None
        }
    };
    match kind {
        config::ValueKind::I64(n) => whole(n.into()),
        config::ValueKind::I128(n) => whole(n),
        config::ValueKind::U64(_) => None,
        config::ValueKind::U128(n) => whole(i128::try_from(n).unwrap_or(i128::MAX)),
        other => match &other {
            config::ValueKind::String(s) if from_env => s.parse::<i128>().ok(),
            _ => None,
        }
        .map_or_else(
            || Some(format!("must be a whole number, not {}", shown(other))),
            whole,
        ),
    }
}

/// What a config key holds.
enum Leaf {
    /// A string.
    Value,
    /// A whole number.
    Integer,
    /// Any number.
    Number,
    /// `true` or `false`.
    Switch,
    List,
}

/// Dotted names of every key, and whether it holds a value or a list, taken
/// from the defaults.
fn leaf_keys() -> BTreeMap<String, Leaf> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, Leaf>) {
        match value {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            serde_json::Value::Array(_) => {
                out.insert(prefix.to_string(), Leaf::List);
            }
            serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => {
                out.insert(prefix.to_string(), Leaf::Integer);
            }
            serde_json::Value::Number(_) => {
                out.insert(prefix.to_string(), Leaf::Number);
            }
            serde_json::Value::Bool(_) => {
                out.insert(prefix.to_string(), Leaf::Switch);
            }
            _ => {
                out.insert(prefix.to_string(), Leaf::Value);
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(defaults) = serde_json::to_value(Config::default()) {
        walk("", &defaults, &mut out);
    }
    out.remove("worlds");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn load_toml(toml: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(toml.as_bytes()).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load(Some(file.path()), env)
    }

    #[test]
    fn defaults_match_the_contract() {
        let s = Config::load(None, Vec::new()).unwrap();
        let c = &s.config;
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.nats.url, "nats://127.0.0.1:4222");
        assert_eq!(c.nats.prefix, "chat");
        assert_eq!(c.http.listen, "0.0.0.0:9464");
        assert!(c.events.approved);
        assert_eq!(c.limits.max_payload_bytes, 65536);
        assert_eq!((c.state.max_worlds, c.state.idle_seconds), (100_000, 3600));
        assert_eq!(c.rules.turns.max, 20);
        assert_eq!(c.rules.depth.max, 8);
        assert_eq!(c.rules.duplicate.window_seconds, 300);
        assert_eq!(c.rules.cooldown.seconds, 0);
        assert_eq!((c.rules.rate.max, c.rules.rate.window_seconds), (10, 60));
        assert_eq!(
            (c.log.format, c.log.level.as_str()),
            (LogFormat::Text, "info")
        );
    }

    #[test]
    fn the_shipped_example_equals_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/loopguard.toml");
        let shipped = Config::load(Some(&path), Vec::new()).unwrap();
        let defaults = Config::load(None, Vec::new()).unwrap();
        assert_eq!(
            serde_json::to_value(&shipped.config).unwrap(),
            serde_json::to_value(&defaults.config).unwrap()
        );
    }

    #[test]
    fn world_sections_override_only_what_they_name() {
        let s = load_toml(
            "[rules.rate]\nmax = 3\n[worlds.Lobby]\nagents = [\"Alice\", \"bob\"]\nrules.turns.max = 10\n",
            &[],
        )
        .unwrap();
        let lobby = s.world(&Name::parse("lobby").unwrap());
        assert_eq!(lobby.rules.turns.max, 10);
        assert_eq!(lobby.rules.rate.max, 3, "global override still applies");
        assert_eq!(lobby.rules.depth.max, 8);
        assert_eq!(lobby.agents[0].as_str(), "alice");
        let other = s.world(&Name::parse("other").unwrap());
        assert_eq!(other.rules.turns.max, 20);
    }

    #[test]
    fn a_world_section_phrase_list_is_matched_by_its_substance() {
        let s = load_toml(
            "[worlds.lobby]\nrules.low_content.phrases = [\"Yo!\", \"Roger that\"]\n",
            &[],
        )
        .unwrap();
        let lobby = &s.world(&Name::parse("lobby").unwrap()).rules.low_content;
        assert!(lobby.phrases.matches("yo") && lobby.phrases.matches("roger that"));
        assert!(
            !lobby.phrases.matches("ok"),
            "the section replaces the list"
        );
        let other = &s.world(&Name::parse("other").unwrap()).rules.low_content;
        assert!(other.phrases.matches("ok") && !other.phrases.matches("yo"));
    }

    #[test]
    fn environment_overrides_file_values() {
        let s = load_toml(
            "[nats]\nurl = \"nats://a:1\"\n",
            &[
                ("LOOPGUARD__NATS__URL", "nats://b:2"),
                ("LOOPGUARD__RULES__TURNS__MAX", "7"),
                ("LOOPGUARD__EVENTS__APPROVED", "false"),
                ("LOOPGUARD__MODE", "observe"),
                ("LOOPGUARD__LIMITS__MAX_PAYLOAD_BYTES", "100"),
                ("LOOPGUARD_CONFIG", "ignored: not an override"),
            ],
        )
        .unwrap();
        assert_eq!(s.config.nats.url, "nats://b:2");
        assert_eq!(s.config.rules.turns.max, 7);
        assert!(!s.config.events.approved);
        assert_eq!(s.config.mode, Mode::Observe);
        assert_eq!(s.config.limits.max_payload_bytes, 100);
    }

    fn error_of(toml: &str, env: &[(&str, &str)]) -> String {
        load_toml(toml, env).unwrap_err().to_string()
    }

    /// Found by review: two variables for one key (names differ in case
    /// past the prefix) resolved by hash order, and a lowercase prefix was
    /// ignored unseen.
    #[test]
    fn one_key_is_set_by_one_variable_whose_prefix_is_in_capitals() {
        let twice = error_of(
            "",
            &[
                ("LOOPGUARD__RULES__RATE__MAX", "5"),
                ("LOOPGUARD__Rules__Rate__Max", "0"),
            ],
        );
        assert!(
            twice.contains("LOOPGUARD__Rules__Rate__Max")
                && twice.contains("as LOOPGUARD__RULES__RATE__MAX does"),
            "{twice}"
        );
        let lists = error_of(
            "",
            &[
                ("LOOPGUARD__CONVERSATION__CONCLUSION_PHRASES", "[\"a\"]"),
                ("LOOPGUARD__conversation__conclusion_phrases", "[\"b\"]"),
            ],
        );
        assert!(lists.contains("set it once"), "{lists}");
        let lower = error_of("", &[("loopguard__rules__turns__max", "3")]);
        assert!(
            lower.contains("loopguard__rules__turns__max")
                && lower.contains("LOOPGUARD__RULES__TURNS__MAX"),
            "{lower}"
        );
        // Other variables that are not loopguard's settings pass.
        load_toml("", &[("loopguard_home", "x"), ("LOOP", "y")]).unwrap();
    }

    /// Found by review: TOML's nan and inf became JSON's null in a world's
    /// rules, which the merge passed over, keeping the global value.
    #[test]
    fn a_world_s_rule_that_is_nan_or_inf_is_refused() {
        for (toml, key) in [
            (
                "[worlds.w]\nrules.turns.max = inf\n",
                "worlds.w.rules.turns.max",
            ),
            (
                "[worlds.w.rules.similar]\nthreshold = nan\n",
                "worlds.w.rules.similar.threshold",
            ),
        ] {
            let e = error_of(toml, &[]);
            assert!(e.contains(key) && e.contains("nan or inf"), "{e}");
        }
    }

    /// A refused number as written, and why: `5.0` not `5`, a negative one
    /// as negative (from a variable too, which was an unnamed type error).
    #[test]
    fn a_refused_whole_number_is_named_as_written() {
        /// (config file, environment, what the message must say)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: [Case; 5] = [
            (
                "[rules.turns]\nmax = 5.0\n",
                &[],
                "must be a whole number, not 5.0",
            ),
            ("[rules.turns]\nmax = 1e3\n", &[], "not 1000.0"),
            (
                "[rules.turns]\nmax = -1\n",
                &[],
                "must be 0 or more, not -1",
            ),
            (
                "",
                &[("LOOPGUARD__RULES__TURNS__MAX", "-1")],
                "LOOPGUARD__RULES__TURNS__MAX: `rules.turns.max` must be 0 or more, not -1",
            ),
            (
                "",
                &[("LOOPGUARD__STATE__MAX_WORLDS", "99999999999999999999")],
                "99999999999999999999 is too large",
            ),
        ];
        for (toml, env, wanted) in cases {
            let e = error_of(toml, env);
            assert!(e.contains(wanted), "{e}");
        }
    }

    #[test]
    fn a_world_lists_at_most_half_a_roster_of_distinct_agents() {
        let list = |n: usize| {
            let names: Vec<String> = (0..n).map(|i| format!("\"a{i}\"")).collect();
            format!("[worlds.w]\nagents = [{}]\n", names.join(","))
        };
        let too_many = error_of(&list(crate::state::MAX_PINNED + 1), &[]);
        assert!(
            too_many.contains("worlds.w.agents") && too_many.contains("513"),
            "{too_many}"
        );
        let full = load_toml(&list(crate::state::MAX_PINNED), &[]).unwrap();
        assert_eq!(full.world(&Name::parse("w").unwrap()).agents.len(), 512);
        // The same name twice (in any case) is one agent.
        let twice = load_toml("[worlds.w]\nagents = [\"Bob\", \"bob\"]\n", &[]).unwrap();
        assert_eq!(twice.world(&Name::parse("w").unwrap()).agents.len(), 1);
    }

    #[test]
    fn a_log_level_that_is_no_level_is_refused() {
        // The last three, tracing read: as trace, or with a field filter
        // that matches an empty value.
        for bad in [
            "warning",
            "inof",
            "info,loopgaurd",
            "loopguard=",
            "[{req=}]",
            "[{req=}]=debug",
        ] {
            let e = error_of(&format!("[log]\nlevel = \"{bad}\"\n"), &[]);
            assert!(
                e.contains("log.level") && e.contains("is not a level"),
                "{bad}: {e}"
            );
        }
        for good in [
            "WARN",
            "info,async_nats=warn",
            "loopguard[decide]=trace",
            "[{req=a}]=debug",
            "loopguard[decide]",
            "off",
        ] {
            let toml = format!("[log]\nlevel = \"{good}\"\n");
            assert!(load_toml(&toml, &[]).is_ok(), "{good}");
        }
    }

    /// Spaces around a directive (or a YAML block scalar's newline) would
    /// make it a target, or no filter: they are trimmed, and the filter
    /// loopguard builds is what the trimmed words say.
    #[test]
    fn a_log_level_s_directives_are_trimmed() {
        for (given, runs) in [
            (" info", "info"),
            ("info ", "info"),
            ("info\n", "info"),
            ("info, async_nats=debug", "info,async_nats=debug"),
            (" warn ,\tloopguard=trace ", "warn,loopguard=trace"),
            ("info,loopguard =debug", "info,loopguard=debug"),
            ("info, async_nats = warn", "info,async_nats=warn"),
            ("info, [{req=a b}]=debug", "info,[{req=a b}]=debug"),
        ] {
            let toml = format!("[log]\nlevel = {given:?}\n");
            let settings = load_toml(&toml, &[]).unwrap_or_else(|e| panic!("{given:?}: {e}"));
            assert_eq!(settings.config.log.level, runs, "{given:?}");
            let filter = tracing_subscriber::EnvFilter::try_new(runs).unwrap();
            assert!(
                filter.to_string().contains(runs.split(',').next().unwrap()),
                "{given:?}: {filter}"
            );
        }
        // Trimmed, a bare word that is no level is still refused.
        let e = error_of("[log]\nlevel = \"info, loopgaurd\"\n", &[]);
        assert!(e.contains("\"loopgaurd\" is not a level"), "{e}");
        // As is a filter of nothing but spaces and commas: it logs nothing.
        for empty in ["", " ", " , "] {
            let e = error_of(&format!("[log]\nlevel = {empty:?}\n"), &[]);
            assert!(e.contains("names no level"), "{empty:?}: {e}");
        }
        let e = error_of("[log]\nlevel = \"info]\"\n", &[]);
        assert!(e.contains("is not a level"), "{e}");
    }

    #[test]
    fn a_bad_server_address_is_shown_without_its_password() {
        let e = error_of("[nats]\nurl = \"nats://lg:hunter2@nats:99999\"\n", &[]);
        assert!(
            e.contains("nats.url") && e.contains("nats://<redacted>@nats:99999"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(without_userinfo("h:1"), "h:1");
        assert_eq!(without_userinfo("u:p@h:1"), "<redacted>@h:1");
        assert_eq!(
            without_userinfo("nats://lg:pa/ss#x@h:1"),
            "nats://<redacted>@h:1"
        );
        let e = error_of("[nats]\nurl = \"nats://lg:pa/ss@nats:4222\"\n", &[]);
        assert!(!e.contains("pa/ss"), "{e}");
    }

    #[test]
    fn a_config_file_that_cannot_be_read_is_named_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let e = Config::load(Some(dir.path()), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&dir.path().display().to_string()) && e.contains("directory"),
            "{e}"
        );
        let latin1 = dir.path().join("latin1.toml");
        std::fs::write(&latin1, b"[http]\nadmin_token = \"caf\xe9\"\n").unwrap();
        let e = Config::load(Some(&latin1), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("latin1.toml") && e.contains("not UTF-8"), "{e}");
        let gone = dir.path().join("gone.toml");
        let e = Config::load(Some(&gone), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gone.toml") && e.contains("not found"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        assert!(error_of("[nats]\nurll = \"x\"\n", &[]).contains("urll"));
        assert!(error_of("colour = 1\n", &[]).contains("colour"));
        assert!(error_of("[worlds.a]\nrules.turns.maxx = 1\n", &[]).contains("maxx"));
    }

    /// A world section's rules are read as one table; its errors still name
    /// the key, not just the section.
    #[test]
    fn a_world_sections_errors_name_the_key() {
        for (toml, key) in [
            (
                "[worlds.a.rules.depth]\nmax = \"x\"\n",
                "worlds.a.rules.depth.max",
            ),
            (
                "[worlds.a.rules.depth]\nmax = -3\n",
                "worlds.a.rules.depth.max",
            ),
            (
                "[worlds.a.rules.depth]\nmaxx = 3\n",
                "worlds.a.rules.depth.maxx",
            ),
            (
                "[worlds.a]\nrules.turns.max = 5\nrules.rate.max = 2.5\n",
                "worlds.a.rules.rate.max",
            ),
            ("[worlds.a]\nrules.colour = 1\n", "worlds.a.rules.colour"),
            (
                "[worlds.a]\nrules.policy.fail = \"shut\"\n",
                "worlds.a.rules.policy.fail",
            ),
            (
                "[worlds.a]\nrules.low_content.phrases = \"ok\"\n",
                "worlds.a.rules.low_content.phrases",
            ),
        ] {
            let e = error_of(toml, &[]);
            assert!(e.contains(&format!("`{key}`")), "{toml}: {e}");
        }
        // Numbers an integer key cannot hold, said plainly.
        for (value, says) in [
            ("-3", "must be 0 or more, not -3"),
            ("2.5", "must be a whole number, not 2.5"),
            ("5.0", "must be a whole number, not 5.0"),
            ("-3.0", "must be a whole number, not -3.0"),
            ("5000000000", "5000000000 is too large"),
        ] {
            let e = error_of(&format!("[worlds.a.rules.depth]\nmax = {value}\n"), &[]);
            assert!(e.contains(says), "{e}");
        }
        // A valid key beside the bad one is not blamed.
        let e = error_of(
            "[worlds.a]\nrules.turns.max = 5\nrules.depth.max = \"x\"\n",
            &[],
        );
        assert!(e.contains("`worlds.a.rules.depth.max`"), "{e}");
    }

    #[test]
    fn invalid_values_are_named() {
        let e = error_of("[rules.turns]\nmax = \"lots\"\n", &[]);
        assert!(e.contains("rules.turns.max"), "{e}");
        assert!(error_of("mode = \"loud\"\n", &[]).contains("loud"));
        assert!(error_of("[nats]\nprefix = \"a.*\"\n", &[]).contains("nats.prefix"));
        assert!(error_of("[http]\nlisten = \"nowhere\"\n", &[]).contains("http.listen"));
        assert!(error_of("[rules.turns]\nmax = -1\n", &[]).contains("rules.turns.max"));
        assert!(error_of("[worlds.\"a.b\"]\n", &[]).contains("worlds.a.b"));
        assert!(error_of("[worlds.a]\nagents = [\"x y\"]\n", &[]).contains("worlds.a.agents"));
        assert!(error_of("[nats]\nurl = \"http://x:4222\"\n", &[]).contains("nats.url"));
        assert!(error_of("[nats]\nurl = \" , \"\n", &[]).contains("nats.url"));
        assert!(error_of("[log]\nlevel = \"loud=[\"\n", &[]).contains("log.level"));
        assert!(error_of("[log]\nformat = \"xml\"\n", &[]).contains("xml"));
        // A range is checked with its feature off too, as the chart's schema does.
        let e = error_of("[rules.policy]\ntimeout_ms = 0\n", &[]);
        assert!(e.contains("rules.policy.timeout_ms"), "{e}");
        let e = error_of("[rules.policy]\ntrip_after = 10001\n", &[]);
        assert!(e.contains("rules.policy.trip_after"), "{e}");
        let e = error_of("[worlds.a]\nrules.rate.max = 10001\n", &[]);
        assert!(
            e.contains("worlds.a.rules.rate.max") && e.contains("10000"),
            "{e}"
        );
        assert!(load_toml("[rules.rate]\nmax = 10000\n", &[]).is_ok());
    }

    #[test]
    fn the_policy_subject_is_none_of_loopguards_own() {
        let policy = |subject: &str| format!("[rules.policy]\nsubject = \"{subject}\"\n");
        for own in [
            "chat.public.audit",
            "chat.raw.w.agent.a",
            "chat.events",
            "chat.private.w.a",
        ] {
            let e = error_of(&policy(own), &[]);
            assert!(
                e.contains("rules.policy.subject") && e.contains(own),
                "{own}: {e}"
            );
        }
        // Per world too, and under another prefix.
        let e = error_of("[worlds.w.rules.policy]\nsubject = \"chat.join.x\"\n", &[]);
        assert!(e.contains("worlds.w.rules.policy.subject"), "{e}");
        let e = error_of(
            &format!("[nats]\nprefix = \"a.b\"\n{}", policy("a.b.public.x")),
            &[],
        );
        assert!(e.contains("a.b.public"), "{e}");
        // Beside them, or under another prefix, a subject is fine.
        for other in [
            "chat.policy.check",
            "chat.publicity",
            "policy.check",
            "chat",
        ] {
            assert!(load_toml(&policy(other), &[]).is_ok(), "{other}");
        }
        let moved = format!("[nats]\nprefix = \"a\"\n{}", policy("chat.public.x"));
        assert!(load_toml(&moved, &[]).is_ok());
    }

    #[test]
    fn a_rule_that_is_on_needs_a_window() {
        let e = error_of("[rules.rate]\nwindow_seconds = 0\n", &[]);
        assert!(e.contains("rules.rate.window_seconds"), "{e}");
        assert!(e.contains("rules.rate.max"), "{e}");
        let e = error_of(
            "[worlds.a]\nrules.budget.max = 5\nrules.budget.window_seconds = 0\n",
            &[],
        );
        assert!(e.contains("worlds.a.rules.budget.window_seconds"), "{e}");
        let e = error_of(
            "[rules.similar]\nthreshold = 0.6\nwindow_seconds = 0\n",
            &[],
        );
        assert!(e.contains("rules.similar.window_seconds"), "{e}");
        // Off by its limit, a window of 0 is fine; the duplicate window is
        // that rule's limit.
        for off in [
            "[rules.rate]\nmax = 0\nwindow_seconds = 0\n",
            "[rules.budget]\nwindow_seconds = 0\n",
            "[rules.similar]\nwindow_seconds = 0\n",
            "[rules.duplicate]\nwindow_seconds = 0\n",
        ] {
            load_toml(off, &[]).unwrap_or_else(|e| panic!("{off}: {e}"));
        }
    }

    #[test]
    fn unknown_and_per_world_environment_variables_are_refused() {
        let e = error_of("", &[("LOOPGUARD__NATS__URLL", "x")]);
        assert!(e.contains("LOOPGUARD__NATS__URLL"), "{e}");
        let e = error_of("", &[("LOOPGUARD__WORLDS__LOBBY__AGENTS", "x")]);
        assert!(e.contains("per-world"), "{e}");
        let e = error_of("", &[("LOOPGUARD__RULES__TURNS__MAX", "many")]);
        assert!(e.contains("max"), "{e}");
        // One underscore after the prefix would otherwise be ignored.
        let e = error_of("", &[("LOOPGUARD_NATS__URL", "nats://x:4222")]);
        assert!(e.contains("LOOPGUARD__NATS__URL"), "{e}");
        assert!(load_toml("", &[("LOOPGUARD_CONFIG_DIR", "x")]).is_ok());
        // Nor single underscores throughout, where they spell a key.
        for (var, meant) in [
            ("LOOPGUARD_NATS_URL", "LOOPGUARD__NATS__URL"),
            ("LOOPGUARD_MODE", "LOOPGUARD__MODE"),
            (
                "LOOPGUARD_RULES_DUPLICATE_WINDOW_SECONDS",
                "LOOPGUARD__RULES__DUPLICATE__WINDOW_SECONDS",
            ),
        ] {
            let e = error_of("", &[(var, "1")]);
            assert!(e.contains(var) && e.contains(meant), "{e}");
        }
        // A section boundary written with one underscore is named.
        for (var, meant) in [
            (
                "LOOPGUARD__RULES__TURNS_MAX",
                "LOOPGUARD__RULES__TURNS__MAX",
            ),
            (
                "LOOPGUARD__NATS__JETSTREAM_ENABLED",
                "LOOPGUARD__NATS__JETSTREAM__ENABLED",
            ),
        ] {
            let e = error_of("", &[(var, "1")]);
            assert!(e.contains(var) && e.contains(meant), "{e}");
        }
        // Kubernetes' service links name no key.
        let links = [
            ("LOOPGUARD_SERVICE_HOST", "10.0.0.1"),
            ("LOOPGUARD_PORT", "tcp://10.0.0.1:9464"),
        ];
        assert!(load_toml("", &links).is_ok());
    }

    #[test]
    fn list_keys_take_a_json_array_from_the_environment() {
        let phrases = r#"["we are done", "over, and out"]"#;
        let s = load_toml(
            "",
            &[
                ("LOOPGUARD__CONVERSATION__CONCLUSION_PHRASES", phrases),
                ("LOOPGUARD__RULES__LOW_CONTENT__PHRASES", "[]"),
            ],
        )
        .unwrap();
        assert_eq!(
            s.config.conversation.conclusion_phrases,
            ["we are done", "over, and out"]
        );
        assert!(s.config.rules.low_content.phrases.is_empty());
        let e = error_of(
            "",
            &[("LOOPGUARD__RULES__LOW_CONTENT__PHRASES", "ok, fine")],
        );
        assert!(
            e.contains("LOOPGUARD__RULES__LOW_CONTENT__PHRASES") && e.contains("JSON array"),
            "{e}"
        );
    }

    /// A token HTTP could never carry (a Secret made from a file ends in a
    /// newline) is refused at start, not answered 401 for ever.
    #[test]
    fn an_admin_token_http_cannot_carry_is_refused() {
        for bad in [
            "s3cret\n",
            "s3cret ",
            "\ts3cret",
            "s3\x01cret",
            "s3cret\x7f",
        ] {
            let e = error_of("", &[("LOOPGUARD__HTTP__ADMIN_TOKEN", bad)]);
            assert!(e.contains("http.admin_token"), "{bad:?}: {e}");
        }
        // What HTTP carries as it is: spaces and tabs inside, UTF-8.
        for good in ["tok-123_~!", "two words", "a\tb", "caf\u{e9}"] {
            assert!(
                load_toml("", &[("LOOPGUARD__HTTP__ADMIN_TOKEN", good)]).is_ok(),
                "{good:?}"
            );
        }
    }

    /// A top-level key after a table, and a value where a table belongs,
    /// are explained (the errors named the wrong table, and a Rust type).
    #[test]
    fn common_toml_mistakes_are_explained() {
        let e = error_of(
            "[conversation]\nwindow_seconds = 60\nmode = \"observe\"\n",
            &[],
        );
        assert!(
            e.contains("`mode` is a top-level key") && e.contains("conversation"),
            "{e}"
        );
        for (toml, key) in [
            ("[rules]\nturns = 10\n", "rules.turns"),
            ("[nats]\ntls = true\n", "nats.tls"),
        ] {
            let e = error_of(toml, &[]);
            assert!(e.contains("expected a table") && e.contains(key), "{e}");
            assert!(!e.contains("struct"), "{e}");
        }
        // An unknown key of the section itself is not a misplaced one.
        let e = error_of("[conversation]\nwindow = 60\n", &[]);
        assert!(!e.contains("top-level"), "{e}");
        // Each names the file (read as text, the crate's errors named
        // none).
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(b"[conversation]\nconclusion_phrases = \"x\"\n")
            .unwrap();
        let e = Config::load(Some(file.path()), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("conversation.conclusion_phrases")
                && e.contains(&file.path().display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn several_nats_urls_are_accepted() {
        let s = load_toml("[nats]\nurl = \"nats://a:4222, tls://b:4223\"\n", &[]).unwrap();
        assert_eq!(s.config.nats.servers().unwrap().len(), 2);
        let s = load_toml(
            "[nats]\nurl = \"nats://a:4222/, b:4223, wss://c/nats\"\n",
            &[],
        );
        assert_eq!(s.unwrap().config.nats.servers().unwrap().len(), 3);
    }

    /// A scheme mistyped (`nats:/`, `nats//`) parsed as host `nats` with a
    /// path, and `--check` said OK; so did a path after the port.
    #[test]
    fn a_nats_url_with_a_path_is_a_typo_and_refused() {
        for url in [
            "nats:/localhost",
            "nats//localhost:4222",
            "nats://h:4222/chat",
            "tls://h:4222?x=1",
        ] {
            let e = error_of(&format!("[nats]\nurl = \"{url}\"\n"), &[]);
            assert!(
                e.contains("`nats.url`") && e.contains("has a path"),
                "{url}: {e}"
            );
        }
    }

    #[test]
    fn a_switch_takes_true_or_false_and_a_number_a_number_as_in_a_world_section() {
        // The config crate read each of these (`1` and `"yes"` as true,
        // `true` as 1.0, turning `similar` on), and `--check` said OK; the
        // same in `[worlds.*]` was refused.
        for written in ["1", "\"yes\"", "\"true\"", "0.0"] {
            let e = error_of(&format!("[events]\napproved = {written}\n"), &[]);
            assert!(
                e.contains("`events.approved`") && e.contains("true or false"),
                "{written}: {e}"
            );
            let world = format!("[worlds.w.rules.low_content]\nenabled = {written}\n");
            assert!(load_toml(&world, &[]).is_err(), "{written} in a world");
        }
        for value in ["off", "yes", "1", "on", " true"] {
            let e = error_of("", &[("LOOPGUARD__EVENTS__APPROVED", value)]);
            assert!(
                e.contains("LOOPGUARD__EVENTS__APPROVED") && e.contains("true or false"),
                "{value:?}: {e}"
            );
        }
        for written in ["true", "\"0.6\""] {
            let e = error_of(&format!("[rules.similar]\nthreshold = {written}\n"), &[]);
            assert!(
                e.contains("`rules.similar.threshold`") && e.contains("a number"),
                "{written}: {e}"
            );
        }
        for value in ["true", "high", "nan", "inf"] {
            let e = error_of("", &[("LOOPGUARD__RULES__SIMILAR__THRESHOLD", value)]);
            assert!(
                e.contains("LOOPGUARD__RULES__SIMILAR__THRESHOLD"),
                "{value:?}: {e}"
            );
        }
        let s = load_toml(
            "[events]\napproved = false\n[rules.similar]\nthreshold = 1\n",
            &[("LOOPGUARD__RULES__LOW_CONTENT__ENABLED", "true")],
        )
        .unwrap();
        assert!(!s.config.events.approved && s.config.rules.low_content.enabled);
        assert_eq!(s.config.rules.similar.threshold, 1.0);
        let s = load_toml(
            "",
            &[
                // In any case, as a tool writing `str(False)` would.
                ("LOOPGUARD__EVENTS__APPROVED", "False"),
                ("LOOPGUARD__RULES__SIMILAR__THRESHOLD", "0.75"),
            ],
        )
        .unwrap();
        assert!(!s.config.events.approved);
        assert_eq!(s.config.rules.similar.threshold, 0.75);
    }

    #[test]
    fn an_integer_key_takes_a_whole_number_and_nothing_read_as_one() {
        // The config crate read each of these as a number (`true` as 1,
        // `"no"` as 0, which turns the rule off), and `--check` said OK.
        for written in ["true", "5.7", "-3.0", "nan", "\"5\"", "1e20"] {
            let e = error_of(&format!("[rules.turns]\nmax = {written}\n"), &[]);
            assert!(
                e.contains("`rules.turns.max`") && e.contains("whole number"),
                "{written}: {e}"
            );
        }
        for value in ["no", "off", "yes", "5.0", " 5"] {
            let e = error_of("", &[("LOOPGUARD__RULES__TURNS__MAX", value)]);
            assert!(
                e.contains("LOOPGUARD__RULES__TURNS__MAX") && e.contains("whole number"),
                "{value:?}: {e}"
            );
        }
        let s = load_toml("[rules.turns]\nmax = 5\n", &[]).unwrap();
        assert_eq!(s.config.rules.turns.max, 5);
        let s = load_toml("", &[("LOOPGUARD__RULES__TURNS__MAX", "7")]).unwrap();
        assert_eq!(s.config.rules.turns.max, 7);
        // Out of the type's range: still the type's own error.
        assert!(error_of("[rules.turns]\nmax = -3\n", &[]).contains("rules.turns.max"));
    }

    #[test]
    fn a_key_of_a_few_words_names_them_when_refused() {
        let e = error_of("mode = \"Observe\"\n", &[]);
        assert!(
            e.contains("`mode`") && e.contains("`enforce`") && e.contains("`observe`"),
            "{e}"
        );
        let e = error_of("", &[("LOOPGUARD__LOG__FORMAT", "JSON")]);
        assert!(
            e.contains("LOOPGUARD__LOG__FORMAT") && e.contains("`json`"),
            "{e}"
        );
        // Every key of the table is one, and takes its default.
        let keys = leaf_keys();
        let defaults = serde_json::to_value(Config::default()).unwrap();
        for (key, check) in WORDS {
            assert!(keys.contains_key(key), "{key}");
            let default = key.split('.').fold(&defaults, |v, k| &v[k]);
            check(default.as_str().unwrap()).unwrap();
        }
    }

    #[test]
    fn a_toml_syntax_error_does_not_quote_the_file() {
        let e = error_of("[nats]\npassword = \"hunter2-secret\n", &[]);
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("line 2") && !e.contains('\n'), "{e}");
        let e = error_of("[http]\nadmin_token = \"abc\\q123\"\n", &[]);
        assert!(!e.contains("abc") && e.contains("escape"), "{e}");
    }

    #[test]
    fn nats_secrets_may_not_hold_a_newline() {
        for (key, var) in [
            ("nats.token", "LOOPGUARD__NATS__TOKEN"),
            ("nats.password", "LOOPGUARD__NATS__PASSWORD"),
            ("nats.user", "LOOPGUARD__NATS__USER"),
            ("nats.nkey_seed", "LOOPGUARD__NATS__NKEY_SEED"),
        ] {
            let mut env = vec![(var, "secret\n")];
            if key == "nats.user" || key == "nats.password" {
                env.push(("LOOPGUARD__NATS__USER", "u"));
                env.push(("LOOPGUARD__NATS__PASSWORD", "p"));
                env.retain(|(v, value)| v != &var || value.ends_with('\n'));
            }
            let e = error_of("", &env);
            assert!(e.contains(key) && !e.contains("secret"), "{key}: {e}");
        }
    }

    #[test]
    fn credentials_in_the_url_are_a_method_of_their_own() {
        let auth = |toml: &str| load_toml(toml, &[]).map(|s| s.config.nats.auth().unwrap());
        // A token, as the NATS tools read `token@`, and both percent-decoded.
        assert_eq!(
            auth("[nats]\nurl = \"nats://s3cr%40t@h:4222\"\n").unwrap(),
            NatsAuth::Token("s3cr@t".into())
        );
        assert_eq!(
            auth("[nats]\nurl = \"nats://lg:p%2Fw@h:4222,nats://lg:p%2Fw@k:4222\"\n").unwrap(),
            NatsAuth::UserPassword {
                user: "lg".into(),
                password: "p/w".into()
            }
        );
        // With another method they were dropped in silence.
        let e = error_of(
            "[nats]\nurl = \"nats://lg:pw@h:4222\"\ntoken = \"t\"\n",
            &[],
        );
        assert!(
            e.contains("nats.url") && e.contains("only one") && !e.contains("pw"),
            "{e}"
        );
        let url = |url: &str| error_of(&format!("[nats]\nurl = \"{url}\"\n"), &[]);
        for (written, why) in [
            ("nats://a@h:4222,nats://b@k:4222", "different"),
            // Some servers with credentials, some without.
            ("nats://lg:pw@h:4222,nats://k:4222", "only some"),
            // An empty password (the url crate reads `lg:@` as `lg@`), no
            // user, and credentials that decode to a newline.
            ("nats://lg:@h:4222", "empty password"),
            ("nats://:pw@h:4222", "no user"),
            ("nats://lg:pw%0A@h:4222", "control character"),
            ("nats://tok%0A@h:4222", "control character"),
        ] {
            let e = url(written);
            assert!(
                e.contains("nats.url") && e.contains(why) && !e.contains("pw"),
                "{written}: {e}"
            );
        }
    }

    #[test]
    fn nats_auth_takes_one_consistent_method_and_never_shows_secrets() {
        let s = load_toml("[nats]\nuser = \"lg\"\npassword = \"hunter2\"\n", &[]).unwrap();
        assert!(matches!(
            s.config.nats.auth().unwrap(),
            NatsAuth::UserPassword { .. }
        ));
        let shown = format!("{:?}", s.config);
        assert!(!shown.contains("hunter2"), "{shown}");
        let s = load_toml("[http]\nadmin_token = \"tok-123\"\n", &[]).unwrap();
        assert!(!format!("{:?}", s.config).contains("tok-123"));
        let s = load_toml("[nats]\nurl = \"nats://u:pw-in-url@h:4222\"\n", &[]).unwrap();
        assert!(!format!("{:?}", s.config).contains("pw-in-url"));
        assert!(error_of("[nats]\nuser = \"lg\"\n", &[]).contains("nats.user"));
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        let both = format!("[nats]\ntoken = \"t\"\nnkey_seed = \"{seed}\"\n");
        let e = error_of(&both, &[]);
        assert!(
            e.contains("only one") && e.contains("nats.token, nats.nkey_seed"),
            "{e}"
        );
        assert!(error_of("[nats]\nnkey_seed = \"XX\"\n", &[]).contains("nats.nkey_seed"));
        assert!(
            error_of("[nats]\ncredentials_file = \"/nope.creds\"\n", &[])
                .contains("nats.credentials_file")
        );
        // Seeds and credentials files are parsed as connecting would.
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let seed_toml = |s: &str| format!("[nats]\nnkey_seed = \"{s}\"\n");
        assert!(load_toml(&seed_toml(&seed), &[]).is_ok());
        for bad in [&account, &seed[..seed.len() - 1], "SUABC"] {
            let e = error_of(&seed_toml(bad), &[]);
            assert!(e.contains("nats.nkey_seed") && !e.contains(bad), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("user.creds");
        let creds_toml = format!("[nats]\ncredentials_file = {:?}\n", creds.to_str().unwrap());
        let jwt =
            "-----BEGIN NATS USER JWT-----\neyJhbGciOi.x.y\n------END NATS USER JWT------\n\n";
        let key = "-----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n";
        std::fs::write(&creds, format!("{jwt}{}", key.replace("{}", &seed))).unwrap();
        assert!(load_toml(&creds_toml, &[]).is_ok());
        for bad in [jwt.to_string(), "not a creds file".to_string()] {
            std::fs::write(&creds, bad).unwrap();
            let e = error_of(&creds_toml, &[]);
            assert!(e.contains("is not a credentials file"), "{e}");
        }
        assert!(error_of("[nats.tls]\nca_file = \"/nope.pem\"\n", &[]).contains("nats.tls.ca_file"));
        // TLS files are read as the client will: PEM certificates, a PEM key.
        let (ca, cert, tls_key) = (
            dir.path().join("ca.crt"),
            dir.path().join("tls.crt"),
            dir.path().join("tls.key"),
        );
        let pem = |label: &str| {
            format!(
                "-----BEGIN {label}-----\nMIIBszCCAVmgAwIBAgIUZ2F0ZQ==\n-----END {label}-----\n"
            )
        };
        std::fs::write(&ca, pem("CERTIFICATE")).unwrap();
        std::fs::write(&cert, pem("CERTIFICATE")).unwrap();
        std::fs::write(&tls_key, pem("PRIVATE KEY")).unwrap();
        let tls_toml =
            format!("[nats.tls]\nca_file = {ca:?}\ncert_file = {cert:?}\nkey_file = {tls_key:?}\n");
        load_toml(&format!("[nats.tls]\nca_file = {ca:?}\n"), &[]).expect("a PEM CA passes");
        // A PEM key that is no key (a real pair, and one that does not go
        // together, are in tests/lifecycle.rs: made with openssl).
        let e = error_of(&tls_toml, &[]);
        assert!(e.contains("nats.tls.key_file"), "{e}");
        for (file, bad, key) in [
            (&ca, "not a certificate\n".to_string(), "nats.tls.ca_file"),
            (&ca, pem("PRIVATE KEY"), "nats.tls.ca_file"),
            (&cert, String::new(), "nats.tls.cert_file"),
            (&tls_key, pem("CERTIFICATE"), "nats.tls.key_file"),
        ] {
            let good = std::fs::read(file).unwrap();
            std::fs::write(file, &bad).unwrap();
            let e = error_of(&tls_toml, &[]);
            assert!(e.contains(key), "{bad:?} in {key}: {e}");
            std::fs::write(file, good).unwrap();
        }
        let e = error_of("", &[("LOOPGUARD__NATS__TLS__REQUIRED", "maybe")]);
        assert!(
            e.contains("nats.tls.required") || e.contains("required"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let e = Config::load(Some(Path::new("/nonexistent/loopguard.toml")), Vec::new());
        assert!(matches!(e, Err(ConfigError::Missing { .. })));
    }
}
