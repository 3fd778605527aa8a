//! The HTTP server (contract §7): metrics, health, readiness, and the admin
//! API to look at and reset a world. hyper 1 over tokio, HTTP/1.1.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (past that a new
//! connection displaces the oldest one that is not being answered; see
//! [`Connections`]), headers within [`MAX_HEADER_BYTES`] and read within
//! [`HEADER_TIMEOUT`], request bodies are never read (a request that
//! announces one over [`MAX_BODY_BYTES`] gets 413), at most [`HANDLERS`]
//! requests other than the probes are answered at once, and a connection
//! that can write none of its reply for [`WRITE_TIMEOUT`] (its client reads
//! nothing, and the socket's buffers are full) is closed.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::clock::{Clock, Stamp};
use crate::judge::Judge;
use crate::metrics::Metrics;
use crate::names::Name;
use crate::state::{self, Conversation};

/// Most HTTP connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest request head accepted.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest request body announced; no route reads one.
pub const MAX_BODY_BYTES: u64 = 4 * 1024;
/// Largest context response; older messages are left out beyond it.
pub const MAX_CONTEXT_BYTES: usize = 4 * 1024 * 1024;
/// Time a client has to send its request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a reply's write may wait without any of it being written: a
/// client that never reads holds its connection, and the part of a large
/// reply (a context, up to [`MAX_CONTEXT_BYTES`]) not yet written, until
/// then. A small reply fits in the socket's buffers: its connection waits
/// idle for its next request, and may be displaced (see [`Connections`]).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests other than the probes answered at once, each on a thread of
/// tokio's blocking pool: plenty for Prometheus and an operator, and a bound
/// on the threads clients can make loopguard hold (a thread returns to the
/// pool just after its permit, so the pool may briefly start one more).
pub const HANDLERS: usize = 4;

/// What `/readyz` answers: subscribed (messages can come in), connected
/// now, the subscriptions confirmed on this connection, not draining.
#[derive(Default)]
pub struct Readiness {
    subscribed: AtomicBool,
    draining: AtomicBool,
    /// The server refused one of loopguard's subscriptions (permissions):
    /// nothing comes in on it until a restart.
    refused: AtomicBool,
    client: OnceLock<async_nats::Client>,
    /// The client's count of connections (`Statistics::connects`) when a
    /// round trip last confirmed the server holds the subscriptions. The
    /// client is connected again before it has sent them again: until a
    /// round trip on the new connection, a message published elsewhere
    /// could pass before them.
    confirmed: Arc<AtomicU64>,
    /// A round trip to confirm them is under way.
    confirming: Arc<AtomicBool>,
}

impl Readiness {
    /// Called once both subscriptions (or the JetStream consumer) exist,
    /// and again when a lost consumer is open again. `confirmed`: the
    /// connection (the client's count of them, see [`connects`]) a round
    /// trip made after the subscriptions certainly came back on, if one
    /// did; otherwise the first probe confirms them.
    pub fn subscribed(&self, client: async_nats::Client, confirmed: Option<u64>) {
        if let Some(connects) = confirmed {
            self.confirmed.fetch_max(connects, Ordering::SeqCst);
        }
        let _ = self.client.set(client);
        self.subscribed.store(true, Ordering::SeqCst);
    }

    /// Confirms the subscriptions on the client's current connection by a
    /// round trip (at once, in the background), unless they are or a
    /// confirmation is under way: called when the client connects again,
    /// and by [`Readiness::is_ready`], so that a lost event delays nothing.
    pub fn confirm(&self) {
        let Some(client) = self.client.get() else {
            return;
        };
        let connects = connects(client);
        if self.confirmed.load(Ordering::SeqCst) >= connects
            || self.confirming.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.confirming.store(false, Ordering::SeqCst);
            return;
        };
        let (client, confirmed, confirming) = (
            client.clone(),
            self.confirmed.clone(),
            self.confirming.clone(),
        );
        runtime.spawn(async move {
            // Queued after the subscriptions the client sends as it
            // connects: its answer comes once the server holds them.
            if client.flush().await.is_ok() {
                confirmed.fetch_max(connects, Ordering::SeqCst);
            }
            confirming.store(false, Ordering::SeqCst);
        });
    }

    /// Whether a round trip confirmed the subscriptions on the client's
    /// current connection; starts one if not.
    fn confirmed(&self) -> bool {
        let Some(client) = self.client.get() else {
            return false;
        };
        let connects = connects(client);
        let confirmed = self.confirmed.load(Ordering::SeqCst) >= connects;
        if !confirmed {
            self.confirm();
        }
        confirmed
    }

    /// Called when the JetStream consumer is lost: until it is open again
    /// no message comes in, connected or not.
    pub fn unsubscribed(&self) {
        self.subscribed.store(false, Ordering::SeqCst);
    }

    /// Called when the server refuses a subscription, or a JetStream pull
    /// or acknowledgement.
    pub fn refused(&self) {
        self.refused.store(true, Ordering::SeqCst);
    }

    /// Called when shutdown starts: load balancers should stop sending.
    pub fn draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the client is connected now, once it is known (subscribed
    /// once). The client's events say so too, but it drops events when
    /// their queue is full (a burst of slow-consumer reports): a scrape
    /// reads the state itself.
    pub fn connected(&self) -> Option<bool> {
        let client = self.client.get()?;
        Some(client.connection_state() == async_nats::connection::State::Connected)
    }

    pub fn is_ready(&self) -> bool {
        self.not_ready().is_none()
    }

    /// Why loopguard is not ready, the first reason that holds (`None`:
    /// ready), for `/readyz` to say: the on-call engineer reads the cause
    /// there, not only in the log.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.draining.load(Ordering::SeqCst) {
            return Some("draining: loopguard is shutting down");
        }
        if self.refused.load(Ordering::SeqCst) {
            return Some("the server refused a subscription, pull or acknowledgement (permissions): see the log");
        }
        if self.client.get().is_none() {
            return Some("not subscribed yet: NATS not reached, or the JetStream stream and consumer still being set up");
        }
        if !self.subscribed.load(Ordering::SeqCst) {
            return Some(
                "not subscribed: the JetStream consumer was lost and is being opened again",
            );
        }
        if self.connected() != Some(true) {
            return Some("not connected to NATS: reconnecting");
        }
        if !self.confirmed() {
            return Some("connected again; the server has not yet confirmed the subscriptions");
        }
        None
    }
}

/// How many times `client` has connected (a reconnect counts one more
/// before the client has sent its subscriptions again).
pub fn connects(client: &async_nats::Client) -> u64 {
    client.statistics().connects.load(Ordering::SeqCst)
}

/// Everything a request handler may read.
pub struct Admin {
    pub metrics: Metrics,
    /// The worlds and the settings in force (reloads included).
    pub judge: Arc<Judge>,
    pub readiness: Arc<Readiness>,
    pub clock: Arc<dyn Clock>,
    /// Empty: the admin API is disabled (403).
    pub admin_token: String,
    /// `state.context_messages`: 0 means no context is kept (404).
    pub context_messages: usize,
    /// The last per-state world counts and when they were taken: visiting
    /// every world is O(worlds), so scrapes within `BY_STATE_TTL` reuse it.
    pub by_state: std::sync::Mutex<Option<(std::time::Instant, [i64; Conversation::ALL.len()])>>,
}

/// How long a per-state count is reused by later scrapes.
pub const BY_STATE_TTL: Duration = Duration::from_secs(5);

/// Accepts and serves HTTP connections on `listener` until the task is
/// dropped (connections already accepted are served until they end).
pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    let open = Arc::new(Connections::default());
    let handlers = Arc::new(tokio::sync::Semaphore::new(HANDLERS));
    // Out of file descriptors, say, it fails again every 50 ms until some
    // are freed: logged once every ten seconds, with the count.
    let accept_failed = crate::metrics::LogLimit::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                if let Some(count) = accept_failed.due() {
                    tracing::warn!(error = %e, count, "http accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(mut slot) = open.admit() else {
            // Closed without a response: there is no one to write it.
            tracing::debug!(%peer, "http: every connection is answering a request; refused");
            continue;
        };
        let (admin, handlers) = (admin.clone(), handlers.clone());
        tokio::spawn(async move {
            let activity = slot.activity.clone();
            let service = hyper::service::service_fn(move |req| {
                let (admin, handlers) = (admin.clone(), handlers.clone());
                let activity = activity.clone();
                async move {
                    if is_probe(&req) {
                        // They read atomics only: answered here, never
                        // behind other requests, which cannot keep the
                        // kubelet's probes waiting.
                        let _answering = Answering::start(&activity);
                        return Ok::<_, Infallible>(handle(&admin, req));
                    }
                    // The permit goes with the handler: one whose client
                    // hung up (this future dropped) still holds it until it
                    // is done, so clients hanging up cannot start more than
                    // HANDLERS at once. (The semaphore is never closed.)
                    let permit = handlers.acquire_owned().await;
                    // Marked answering only now: a connection whose request
                    // waits for its turn may be displaced, so connections
                    // queued behind slow handlers cannot keep new ones (the
                    // probes') out.
                    let _answering = Answering::start(&activity);
                    // Off the runtime's threads: a scrape visits every world
                    // (about 100 ms at 100,000 worlds), and with one runtime
                    // thread that time would be taken from the messages.
                    let reply = tokio::task::spawn_blocking(move || {
                        let _permit = permit;
                        #[cfg(debug_assertions)]
                        crate::fault::hold_handler();
                        handle(&admin, req)
                    })
                    .await
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, "http handler failed");
                        text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
                    });
                    Ok(reply)
                }
            });
            let mut stream = tokio_io_timeout::TimeoutWriter::new(stream);
            stream.set_timeout(Some(write_timeout()));
            // Pinned here (its timer cannot move), so hyper is given an
            // `Unpin` reference to it.
            let stream = std::pin::pin!(stream);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                ended = conn.as_mut() => if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "http connection ended with an error");
                },
                _ = &mut slot.displaced => {
                    tracing::debug!(%peer, "http connection closed for a newer one");
                    // One that answered a request may still be writing its
                    // reply: it closes once that is written (an idle one at
                    // once), within a bound, and few at a time. One that
                    // never got a whole request head closes now.
                    if slot.activity.answered.load(Ordering::Relaxed) {
                        if let Ok(_finishing) = slot.open.finishing.try_acquire() {
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(DISPLACED_GRACE, conn.as_mut()).await;
                        }
                    }
                }
            }
        });
    }
}

/// [`WRITE_TIMEOUT`]; in debug builds, `LOOPGUARD_TEST_HTTP_WRITE_TIMEOUT_MS`
/// when set, so that a test need not wait out the real one.
fn write_timeout() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(timeout) = crate::fault::http_write_timeout() {
        return timeout;
    }
    WRITE_TIMEOUT
}

/// How long a displaced connection has to finish writing a reply.
const DISPLACED_GRACE: Duration = Duration::from_secs(1);

/// `/healthz` or `/readyz`, asked with GET or HEAD, the path read as
/// [`handle`] reads it.
fn is_probe<B>(req: &Request<B>) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && matches!(
            req.uri().path().trim_start_matches('/'),
            "healthz" | "readyz"
        )
}

/// The connections served now, oldest first. Past [`MAX_CONNECTIONS`] a new
/// connection closes the oldest one not answering a request (one sending
/// its request head, one whose request waits for its handler's turn, or
/// one idle between requests): clients holding every connection open, each
/// sending its head a byte at a time, would otherwise keep the kubelet's
/// probes out until it restarts the pod. Only when every connection is
/// answering a request is the new one refused.
struct Connections {
    held: Mutex<Held>,
    /// Displaced connections finishing a reply (see [`DISPLACED_GRACE`]),
    /// bounded so that a flood of connections cannot keep many open past
    /// [`MAX_CONNECTIONS`].
    finishing: tokio::sync::Semaphore,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            held: Mutex::default(),
            finishing: tokio::sync::Semaphore::new(MAX_CONNECTIONS / 4),
        }
    }
}

#[derive(Default)]
struct Held {
    next: u64,
    /// By accept order: what each is doing, and what closes it.
    open: BTreeMap<u64, (Arc<Activity>, oneshot::Sender<()>)>,
}

/// What a connection is doing.
#[derive(Default)]
struct Activity {
    /// A request is being answered: from its handler's turn (at once for a
    /// probe) to its reply.
    answering: AtomicBool,
    /// A request was answered: its reply may still be being written.
    answered: AtomicBool,
}

/// Marks a connection as answering a request while it lives.
struct Answering(Arc<Activity>);

impl Answering {
    fn start(activity: &Arc<Activity>) -> Answering {
        activity.answered.store(true, Ordering::Relaxed);
        activity.answering.store(true, Ordering::Relaxed);
        Answering(activity.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.store(false, Ordering::Relaxed);
    }
}

/// One admitted connection; dropped, it leaves [`Connections`].
struct Slot {
    id: u64,
    open: Arc<Connections>,
    activity: Arc<Activity>,
    /// Resolves when a newer connection displaced this one.
    displaced: oneshot::Receiver<()>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.close(self.id);
    }
}

impl Connections {
    /// Registers a new connection, displacing the oldest one not answering
    /// a request when all slots are taken; `None` when every one is.
    fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.open.len() >= MAX_CONNECTIONS {
            let oldest_idle = held
                .open
                .iter()
                .find(|(_, (activity, _))| !activity.answering.load(Ordering::Relaxed))
                .map(|(&id, _)| id)?;
            if let Some((_, close)) = held.open.remove(&oldest_idle) {
                let _ = close.send(());
            }
        }
        let id = held.next;
        held.next += 1;
        let activity = Arc::new(Activity::default());
        let (close, displaced) = oneshot::channel();
        held.open.insert(id, (activity.clone(), close));
        Some(Slot {
            id,
            open: self.clone(),
            activity,
            displaced,
        })
    }

    fn close(&self, id: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.open.remove(&id);
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: &'static str) -> Reply {
    reply(status, "text/plain; charset=utf-8", body)
}

/// 405, with the methods the route takes (RFC 9110 §15.5.6).
fn not_allowed(allow: &'static str) -> Reply {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

fn json_error(status: StatusCode, message: String) -> Reply {
    let body = serde_json::json!({ "error": message }).to_string();
    reply(status, "application/json", body)
}

/// Routes one request. Synchronous: no route waits on anything, and
/// [`serve`] runs it on the blocking pool, beside the runtime (the probes,
/// which read atomics only, on the runtime). No route reads the body (any
/// body type will do: the tests build requests without a connection).
pub fn handle<B>(admin: &Admin, req: Request<B>) -> Reply {
    let announced = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY_BYTES) {
        return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
    }
    let segments: Vec<&str> = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .collect();
    // HEAD is GET without the body (hyper leaves it out).
    let method = match req.method() {
        &Method::HEAD => &Method::GET,
        m => m,
    };
    match (method, segments.as_slice()) {
        (&Method::GET, ["metrics"]) => {
            admin.metrics.worlds.set(admin.judge.worlds().len() as i64);
            let bytes = admin.judge.worlds().bytes();
            admin
                .metrics
                .state_bytes
                .set(bytes.try_into().unwrap_or(i64::MAX));
            admin.metrics.set_worlds_by_state(worlds_by_state(admin));
            admin.metrics.sync_client_counts();
            if let Some(connected) = admin.readiness.connected() {
                admin.metrics.nats_connected.set(i64::from(connected));
            }
            admin
                .metrics
                .ready
                .set(i64::from(admin.readiness.is_ready()));
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                admin.metrics.encode(),
            )
        }
        (&Method::GET, ["healthz"]) => text(StatusCode::OK, "ok\n"),
        (&Method::GET, ["readyz"]) => {
            let why = admin.readiness.not_ready();
            admin.metrics.ready.set(i64::from(why.is_none()));
            match why {
                None => text(StatusCode::OK, "ready\n"),
                Some(why) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    format!("not ready: {why}\n"),
                ),
            }
        }
        (&Method::GET, ["v1", "worlds", world]) => world_view(admin, world),
        (&Method::GET, ["v1", "worlds", world, "agents", agent, "context"]) => {
            // An agent's context holds its private inbox: admin token only.
            match unauthorised(admin, &req) {
                Some(denied) => denied,
                None => context(admin, world, agent, req.uri().query()),
            }
        }
        (&Method::POST, ["v1", "worlds", world, "reset"]) => reset(admin, &req, world),
        (_, ["v1", "worlds", _, "reset"]) => not_allowed("POST"),
        (
            _,
            ["metrics" | "healthz" | "readyz"]
            | ["v1", "worlds", _]
            | ["v1", "worlds", _, "agents", _, "context"],
        ) => not_allowed("GET, HEAD"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The conversation window and hot threshold in force.
fn conversation_limits(admin: &Admin) -> (Duration, u32) {
    let settings = admin.judge.settings();
    let c = &settings.config.conversation;
    (Duration::from_secs(c.window_seconds), c.hot_messages)
}

/// How many worlds are in each conversation state (computed at scrape:
/// the state changes with time alone).
fn worlds_by_state(admin: &Admin) -> [i64; Conversation::ALL.len()] {
    let mut cached = admin.by_state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, counts)) = *cached {
        if at.elapsed() < BY_STATE_TTL {
            return counts;
        }
    }
    let now = Stamp::of(admin.clock.now());
    let (window, hot) = conversation_limits(admin);
    let mut counts = [0; Conversation::ALL.len()];
    admin.judge.worlds().for_each(|_, handle| {
        counts[state::lock(handle).conversation(now, window, hot) as usize] += 1;
    });
    *cached = Some((std::time::Instant::now(), counts));
    counts
}

fn bad_world(e: crate::names::NameError) -> Reply {
    json_error(StatusCode::BAD_REQUEST, format!("world name {e}"))
}

fn world_view(admin: &Admin, raw: &str) -> Reply {
    let world = match Name::parse(raw) {
        Ok(w) => w,
        Err(e) => return bad_world(e),
    };
    // The cache takes the machine's instant, a world's state its stamp.
    let instant = admin.clock.now();
    let now = Stamp::of(instant);
    let (window, hot) = conversation_limits(admin);
    let show = |w: &state::WorldState| w.view(&world, now, w.conversation(now, window, hot));
    let view = match admin.judge.worlds().get(&world, instant) {
        Some(handle) => {
            // As its next message would find it after a reload: the pins,
            // the rate window, the pause. Read under the world's lock, as a
            // decision reads them, so the two never undo each other.
            let mut w = state::lock(&handle);
            let settings = admin.judge.settings();
            if w.bring_onto(settings.world(&world), settings.config.mode, now) {
                // Weighed again, as a message would have it: newly listed
                // agents may have grown it.
                admin.judge.worlds().weigh_if_held(&world, &handle, &w);
            }
            show(&w)
        }
        None => {
            // A world the config lists has its agents before its first
            // message (or again after eviction): shown as it would start,
            // without creating its state.
            let settings = admin.judge.settings();
            let Some(listed) = settings.worlds.get(&world) else {
                return json_error(
                    StatusCode::NOT_FOUND,
                    format!("no state held for world {world}, and the config does not list it"),
                );
            };
            let idle = Duration::from_secs(settings.config.state.idle_seconds);
            show(&state::WorldState::new(listed.clone(), idle, now))
        }
    };
    // Written after the world's lock is released: its decisions wait for
    // the view, not for the JSON.
    match serde_json::to_vec(&view) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// An agent's clean context: what it was expected to act on plus its own
/// messages, oldest first, as a JSON array of egress messages.
fn context(admin: &Admin, world: &str, agent: &str, query: Option<&str>) -> Reply {
    let (world, agent) = match (Name::parse(world), Name::parse(agent)) {
        (Ok(w), Ok(a)) => (w, a),
        (Err(e), _) => return bad_world(e),
        (_, Err(e)) => return json_error(StatusCode::BAD_REQUEST, format!("agent name {e}")),
    };
    if admin.context_messages == 0 {
        return json_error(
            StatusCode::NOT_FOUND,
            "no context is kept: set state.context_messages".into(),
        );
    }
    let limit = query
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("limit=")))
        .map(|v| v.parse::<usize>().map_err(|_| v.to_string()));
    let limit = match limit {
        None => 20,
        Some(Ok(n)) if n >= 1 => n.min(admin.context_messages),
        Some(_) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "limit must be a whole number from 1".into(),
            )
        }
    };
    let Some(handle) = admin.judge.worlds().get(&world, admin.clock.now()) else {
        return json_error(
            StatusCode::NOT_FOUND,
            format!("no state held for world {world}"),
        );
    };
    let mut bodies = state::lock(&handle).context_of(&agent, limit);
    keep_newest_within(&mut bodies, MAX_CONTEXT_BYTES);
    let mut out = Vec::with_capacity(2 + bodies.iter().map(|b| b.len() + 1).sum::<usize>());
    out.push(b'[');
    for (i, body) in bodies.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(body);
    }
    out.push(b']');
    reply(StatusCode::OK, "application/json", out)
}

/// Bounds a context response: drops the oldest of `bodies` (oldest first)
/// until the rest fit in `max` bytes as a JSON array, but never the newest,
/// however large (a server that takes payloads that large let it through):
/// an agent asking for its context gets at least what it was sent last.
fn keep_newest_within(bodies: &mut Vec<bytes::Bytes>, max: usize) {
    // n bodies, n - 1 commas and two brackets.
    let mut total: usize = 1 + bodies.iter().map(|b| b.len() + 1).sum::<usize>();
    let mut drop = 0;
    while total > max && drop + 1 < bodies.len() {
        total -= bodies[drop].len() + 1;
        drop += 1;
    }
    bodies.drain(..drop);
}

/// The admin bearer-token check: `None` when authorised, else the answer
/// (403 with no token configured, 401 when missing or wrong).
fn unauthorised<B>(admin: &Admin, req: &Request<B>) -> Option<Reply> {
    if admin.admin_token.is_empty() {
        return Some(json_error(
            StatusCode::FORBIDDEN,
            "the admin API is disabled: set http.admin_token".into(),
        ));
    }
    // The scheme's name is case-insensitive, and one or more spaces
    // follow it (RFC 9110, 11.4).
    let presented = req.headers().get(AUTHORIZATION).and_then(|v| {
        let (scheme, rest) = v.as_bytes().split_at_checked(6)?;
        (scheme.eq_ignore_ascii_case(b"Bearer") && rest.starts_with(b" "))
            .then(|| rest.trim_ascii_start())
    });
    if presented.is_some_and(|t| constant_time_eq(t, admin.admin_token.as_bytes())) {
        return None;
    }
    let mut r = json_error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token".into(),
    );
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(r)
}

fn reset<B>(admin: &Admin, req: &Request<B>, raw: &str) -> Reply {
    if let Some(denied) = unauthorised(admin, req) {
        return denied;
    }
    let world = match Name::parse(raw) {
        Ok(w) => w,
        Err(e) => return bad_world(e),
    };
    if let Some(handle) = admin.judge.worlds().get(&world, admin.clock.now()) {
        state::lock(&handle).reset();
    }
    tracing::info!(world = %world, "world reset through the admin API");
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

/// Compares without an early exit, so the time taken does not tell how much
/// of a guessed token was right (only its length).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An admin API over a judge that holds world `w` (agent `a` spoke in
    /// it), with token `tok` and contexts kept.
    fn admin() -> Admin {
        let settings = Arc::new(crate::config::Config::default().validate().unwrap());
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::SystemClock);
        let metrics = Metrics::new();
        let judge = Arc::new(Judge::new(settings, clock.clone(), metrics.clone()));
        let origin = crate::subject::Origin::Raw {
            world: Name::parse("w").unwrap(),
            kind: crate::subject::SenderKind::Agent,
            sender: Name::parse("a").unwrap(),
        };
        judge.decide(origin, br#"{"content":"hi"}"#, Default::default());
        Admin {
            metrics,
            judge,
            readiness: Arc::new(Readiness::default()),
            clock,
            admin_token: "tok".into(),
            context_messages: 20,
            by_state: Default::default(),
        }
    }

    proptest::proptest! {
        // Each route, method and header meets the others often enough.
        #![proptest_config(proptest::test_runner::Config::with_cases(4096))]

        /// Whatever method, path, query and headers a client sends, the
        /// answer is one of the routes' statuses, never a panic, and a JSON
        /// answer is JSON.
        #[test]
        fn any_request_gets_an_answer_of_the_api(
            method in proptest::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "X-Y"]),
            route in proptest::sample::select(vec![
                "", "v1", "v1/worlds", "v1/worlds/{w}", "v1/worlds/{w}/reset",
                "v1/worlds/{w}/agents/{a}/context", "v1/worlds/{w}/agents/{a}",
                "metrics", "healthz", "readyz", "readyz/", "metrics/x",
            ]),
            names in proptest::collection::vec(proptest::sample::select(vec![
                "w", "W", "a", "", "..", "%00", "%2F", "b%C3%B8d", "a.b", "*", "%3E", "%FF%FE",
                "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            ]), 2),
            query in proptest::sample::select(vec![
                "", "?limit=5", "?limit=0", "?limit=-1", "?limit=99999999999999999999",
                "?limit=%FF", "?limit", "?a=b&limit=2&limit=3", "?%",
            ]),
            auth in proptest::sample::select(vec![
                &b""[..], b"Bearer tok", b"bearer    tok", b"Bearer", b"Bearer tok2", b"Basic tok",
                b"Bearer \xfftok", b"BEARER tok", b"Bear",
            ]),
            length in proptest::sample::select(vec!["", "0", "4096", "4097", "-1", "99999999999999999999999", "x"]),
        ) {
            static ADMIN: OnceLock<Admin> = OnceLock::new();
            let admin = ADMIN.get_or_init(admin);
            let path = route.replace("{w}", names[0]).replace("{a}", names[1]);
            let uri = format!("/{path}{query}");
            let mut builder = Request::builder().method(method).uri(&uri);
            if !auth.is_empty() {
                builder = builder.header(AUTHORIZATION, HeaderValue::from_bytes(auth).unwrap());
            }
            if !length.is_empty() {
                builder = builder.header(CONTENT_LENGTH, length);
            }
            let Ok(req) = builder.body(()) else {
                return Ok(()); // not a request hyper would hand over
            };
            let r = handle(admin, req);
            let status = r.status().as_u16();
            proptest::prop_assert!(
                [200, 204, 400, 401, 403, 404, 405, 413, 503].contains(&status),
                "{method} {uri}: {status}"
            );
            let json = r
                .headers()
                .get(CONTENT_TYPE)
                .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
            if json {
                // A `Full` body: ready at once.
                let collected = futures::FutureExt::now_or_never(
                    http_body_util::BodyExt::collect(r.into_body()),
                );
                let body = collected.unwrap().unwrap().to_bytes();
                proptest::prop_assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
            }
        }
    }

    /// `/readyz` names the first reason that holds: draining before a
    /// refusal, a refusal before set-up.
    #[test]
    fn not_ready_names_the_first_reason_that_holds() {
        let r = Readiness::default();
        assert!(r.not_ready().unwrap().starts_with("not subscribed yet"));
        r.refused();
        assert!(r.not_ready().unwrap().contains("refused"));
        r.draining();
        assert!(r.not_ready().unwrap().starts_with("draining"));
        assert!(!r.is_ready());
    }

    /// A reload that lists agents in a world grows it: shown by the view
    /// before its next message, it is weighed then too, as a message
    /// would have it weighed (until 2026-11-24 its weight stayed stale).
    #[test]
    fn the_view_weighs_a_world_it_brings_onto_new_settings() {
        let admin = admin();
        let worlds = admin.judge.worlds();
        worlds.upkeep();
        let before = worlds.bytes();
        let agents: Vec<String> = (0..512).map(|i| format!("\"agent{i}\"")).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(
            &mut file,
            format!("[worlds.w]\nagents = [{}]\n", agents.join(", ")).as_bytes(),
        )
        .unwrap();
        let reloaded = crate::config::Config::load(Some(file.path()), Vec::new()).unwrap();
        admin.judge.reload(reloaded).unwrap();
        let req = Request::builder().uri("/v1/worlds/w").body(()).unwrap();
        assert_eq!(handle(&admin, req).status(), StatusCode::OK);
        worlds.upkeep();
        let after = worlds.bytes();
        // 512 roster entries of a few dozen bytes each, at least.
        assert!(after > before + 512 * 16, "{before} -> {after}");
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn a_context_keeps_its_newest_messages_within_the_bound_and_the_newest_always() {
        let sizes = |bodies: &[bytes::Bytes]| bodies.iter().map(|b| b.len()).collect::<Vec<_>>();
        let bodies = |sizes: &[usize]| -> Vec<bytes::Bytes> {
            sizes.iter().map(|&n| vec![b'x'; n].into()).collect()
        };
        // `[xxx,xxxx,xxxxx]`: 16 bytes.
        let mut fit = bodies(&[3, 4, 5]);
        keep_newest_within(&mut fit, 16);
        assert_eq!(sizes(&fit), [3, 4, 5]);
        let mut over = bodies(&[3, 4, 5]);
        keep_newest_within(&mut over, 15);
        assert_eq!(sizes(&over), [4, 5]);
        let mut huge = bodies(&[3, 4, 50]);
        keep_newest_within(&mut huge, 15);
        assert_eq!(sizes(&huge), [50], "the newest, however large");
        let mut none = bodies(&[]);
        keep_newest_within(&mut none, 14);
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn past_the_limit_a_new_connection_displaces_the_oldest_not_answering() {
        use tokio::sync::oneshot::error::TryRecvError;
        let open = Arc::new(Connections::default());
        let mut slots: Vec<Slot> = (0..MAX_CONNECTIONS)
            .map(|_| open.admit().expect("a free slot"))
            .collect();
        // The two oldest are answering a request: the third goes.
        let answering: Vec<_> = slots[..2]
            .iter()
            .map(|s| Answering::start(&s.activity))
            .collect();
        let newest = open.admit().expect("a slot, displacing one");
        // Told inside `admit`: a `try_recv`, so a broken displacement fails
        // here rather than waiting forever.
        assert!(
            slots[2].displaced.try_recv().is_ok(),
            "the oldest idle one is told to close"
        );
        for slot in slots.iter_mut().filter(|s| s.id != 2) {
            let kept = slot.displaced.try_recv();
            assert!(matches!(kept, Err(TryRecvError::Empty)), "slot {}", slot.id);
        }
        assert_eq!(open.held.lock().unwrap().open.len(), MAX_CONNECTIONS);
        // A connection that ends frees its slot without displacing any.
        drop(newest);
        let again = open.admit().expect("the freed slot");
        let kept = slots[3].displaced.try_recv();
        assert!(matches!(kept, Err(TryRecvError::Empty)));
        // Every connection answering: the new one is refused.
        let all: Vec<_> = slots
            .iter()
            .chain([&again])
            .map(|s| Answering::start(&s.activity))
            .collect();
        assert!(open.admit().is_none());
        // An answer done, that connection can be displaced again.
        drop(answering);
        drop(all);
        assert!(open.admit().is_some());
        assert!(slots[0].displaced.try_recv().is_ok());
    }
}
