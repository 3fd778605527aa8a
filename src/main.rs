//! The `loopguard` binary: parse flags, load and validate the configuration
//! before touching the network, then run until SIGTERM or SIGINT.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use loopguard::config::Config;

/// Exit code for a configuration that cannot be used (as `--check` reports).
const EXIT_CONFIG: u8 = 2;

/// A NATS sidecar that stops multi-agent chat loops.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML configuration file (else the file LOOPGUARD_CONFIG names);
    /// without one the built-in defaults apply.
    #[arg(short = 'c', long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Validate the configuration, print the outcome, and exit (0 valid, 2 not).
    #[arg(long)]
    check: bool,
}

/// Logs go to standard error, as text or JSON; `RUST_LOG` wins over
/// `log.level` when set, read as `log.level` is (trimmed, each bare word a
/// level), unless loopguard would refuse it there (or it is not UTF-8):
/// then `log.level` applies, and the first line says so.
fn init_logs(log: &loopguard::config::LogConfig) {
    use tracing_subscriber::EnvFilter;
    let from_env = std::env::var_os("RUST_LOG").filter(|v| !v.is_empty());
    let parsed = from_env.as_deref().map(|v| match v.to_str() {
        Some(text) => loopguard::config::log_filter(text),
        None => Err("not UTF-8".to_string()),
    });
    let (filter, refused) = match parsed {
        Some(Ok(filter)) => (EnvFilter::new(filter), None),
        Some(Err(e)) => (EnvFilter::new(&log.level), Some(e)),
        None => (EnvFilter::new(&log.level), None),
    };
    init_format(log, filter);
    if let (Some(e), Some(value)) = (refused, from_env) {
        tracing::warn!(rust_log = ?value, error = %e, level = %log.level, "RUST_LOG refused; log.level applies");
    }
}

/// Lines the log writer holds while standard error does not take them;
/// past that they are dropped (a few MiB of lines at most).
const LOG_LINES_BUFFERED: usize = 16_384;

/// The log writer's thread, which writes what is still queued when this
/// guard is dropped ([`flush_logs`]): kept here, as `process::exit` runs no
/// destructors.
static LOG_WRITER: std::sync::Mutex<Option<tracing_appender::non_blocking::WorkerGuard>> =
    std::sync::Mutex::new(None);

/// Writes the log lines still queued (waiting at most about a second for a
/// standard error that does not take them), before an exit.
fn flush_logs() {
    let guard = LOG_WRITER.lock().ok().and_then(|mut held| held.take());
    drop(guard);
}

fn init_format(log: &loopguard::config::LogConfig, filter: tracing_subscriber::EnvFilter) {
    // Written by a thread of its own, through a bounded queue that drops
    // lines when full: a standard error that takes nothing (a log shipper
    // that stalled) then costs log lines, not decisions; written from the
    // runtime's threads, a full pipe blocked them, and loopguard stopped
    // deciding and did not answer SIGTERM.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_LINES_BUFFERED)
        .lossy(true)
        .thread_name("loopguard-log")
        .finish(std::io::stderr());
    if let Ok(mut held) = LOG_WRITER.lock() {
        *held = Some(guard);
    }
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        // A log line that cannot be written (standard error a pipe whose
        // reader is gone) is lost, not reported: the report goes to
        // standard error too, with eprintln!, whose panic took the logging
        // task with it (the signal's: SIGTERM then never stopped loopguard).
        .log_internal_errors(false)
        .with_env_filter(filter);
    match log.format {
        loopguard::config::LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        loopguard::config::LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.config.is_none() {
        // Read here rather than by clap, whose error for an empty one names
        // `--config`, which the user did not give.
        match std::env::var_os("LOOPGUARD_CONFIG") {
            Some(path) if path.is_empty() => {
                refuse(&"LOOPGUARD_CONFIG is set but empty: give the file's path, or unset it for the defaults");
                return ExitCode::from(EXIT_CONFIG);
            }
            path => args.config = path.map(PathBuf::from),
        }
    }
    // Read before the file is: the watch applies any change from here on.
    let stamp = args
        .config
        .as_deref()
        .and_then(loopguard::app::FileStamp::of);
    let loaded =
        loopguard::config::environment().and_then(|env| Config::load(args.config.as_deref(), env));
    let settings = match loaded {
        Ok(settings) => settings,
        Err(e) => {
            refuse(&e);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args.check {
        // The exit code is the outcome: an unwritable output (`> /dev/full`)
        // does not change it (println! would panic, exit 101).
        let _ = writeln!(std::io::stdout(), "loopguard: configuration OK");
        return ExitCode::SUCCESS;
    }

    init_logs(&settings.config.log);

    let threads = settings.config.runtime.threads;
    let runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            fatal("cannot start the runtime", &e);
            flush_logs();
            return ExitCode::FAILURE;
        }
    };
    // Listening first: a signal during start-up is handled, not fatal.
    let (mut signals, hangup) = {
        let _runtime = runtime.enter();
        (
            loopguard::shutdown::Signals::listen(),
            loopguard::shutdown::Hangup::listen(),
        )
    };
    let path = args.config.clone();
    let reload = loopguard::app::Reloader {
        load: Box::new(move || Config::load(path.as_deref(), loopguard::config::environment()?)),
        path: args.config.clone(),
        loaded: stamp,
        hangup,
    };
    let result = runtime.block_on(loopguard::app::run(
        settings,
        async move {
            let signal = signals.recv().await;
            // A second signal ends the drain at once: for whoever will not
            // wait out a long grace period (Ctrl-C twice). One within a
            // second of the first is the same request: a wrapper passing a
            // Ctrl-C on as SIGTERM while the terminal's SIGINT comes too.
            // (Timed from before the log line that tells of the first.)
            let first = std::time::Instant::now();
            tracing::info!(signal, "shutdown: signal received");
            tokio::spawn(async move {
                loop {
                    let signal = signals.recv().await;
                    if first.elapsed() >= std::time::Duration::from_secs(1) {
                        tracing::warn!(
                            signal,
                            "shutdown: second signal, exiting now with work left"
                        );
                        flush_logs();
                        std::process::exit(1);
                    }
                    tracing::info!(
                        signal,
                        "shutdown: signal within a second of the first, taken as the same; \
                         one after that exits at once"
                    );
                }
            });
        },
        Some(reload),
    ));
    runtime.shutdown_timeout(loopguard::app::RUNTIME_STOP_BOUND);
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal("loopguard stopped", &e);
            ExitCode::FAILURE
        }
    };
    // Every line logged, the last included, is written before the exit.
    flush_logs();
    code
}

/// Says why the configuration cannot be used, on standard error; one that
/// cannot be written does not change the exit code (eprintln! would panic).
fn refuse(why: &dyn std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "loopguard: invalid configuration: {why}");
}

/// Tells why loopguard ends: a log line in the configured format (JSON
/// lines stay JSON), and a plain line on standard error only where the log
/// would not show it (`log.level` above `error`, e.g. `off`); as for
/// [`refuse`], an unwritable standard error does not change the exit code.
fn fatal(what: &str, e: &dyn std::fmt::Display) {
    tracing::error!(error = %e, "{what}");
    if !tracing::enabled!(tracing::Level::ERROR) {
        let _ = writeln!(std::io::stderr(), "loopguard: {what}: {e}");
    }
}
