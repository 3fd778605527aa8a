//! Signals: SIGTERM (how orchestrators stop us) and SIGINT (Ctrl-C) stop
//! loopguard; SIGHUP reloads its configuration.

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
                    tracing::warn!(error = %e, signal = name, "cannot listen for a signal; it will not stop loopguard gracefully");
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

/// Listens for SIGHUP from the moment it is made (within the runtime), as
/// [`Signals`] does for the stop signals: one that comes while loopguard is
/// still starting is kept, and reloads once reloads are set up, rather than
/// taking the default action (the process ended).
pub struct Hangup {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    /// Must be called within the runtime.
    pub fn listen() -> Hangup {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let hup = signal(SignalKind::hangup())
                .inspect_err(|e| {
                    tracing::warn!(
                        error = %e,
                        "cannot listen for SIGHUP: one will end loopguard, not reload it"
                    );
                })
                .ok();
            Hangup { hup }
        }
        #[cfg(not(unix))]
        Hangup {}
    }

    /// Resolves at the next SIGHUP (at once for one that came since the
    /// last call, or since [`Hangup::listen`]); never where there is none.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(hup) = &mut self.hup {
            if hup.recv().await.is_some() {
                return;
            }
        }
        std::future::pending().await
    }
}
