//! Shutdown signals: SIGTERM (how orchestrators stop us) and SIGINT (Ctrl-C).

/// Listens for SIGTERM and SIGINT from the moment it is made (within the
/// runtime), so a signal that comes while loopguard is still starting, before
/// anything awaits it, stops it gracefully rather than by the default action
/// (killed, exit 143).
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Must be called within the runtime.
    pub fn listen() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let open = |kind, name: &str| match signal(kind) {
                Ok(listener) => Some(listener),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for {name}; it will not stop loopguard gracefully");
                    None
                }
            };
            Signals {
                term: open(SignalKind::terminate(), "SIGTERM"),
                int: open(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Resolves when the process is asked to stop (again, when called
    /// again); returns the signal's name.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            async fn next(listener: &mut Option<tokio::signal::unix::Signal>) {
                match listener {
                    Some(listener) => {
                        listener.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.term) => "SIGTERM",
                _ = next(&mut self.int) => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
