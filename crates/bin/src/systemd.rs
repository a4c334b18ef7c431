//! systemd's notify protocol, for a `Type=notify` unit: `READY=1` once the sync loop runs,
//! `WATCHDOG=1` every half `WatchdogSec` while the agent is healthy (as `/healthz` judges it, so a
//! stuck sync loop or PLEG lets systemd restart the agent, as upstream's watchdog does), and
//! `STOPPING=1` at shutdown. Without `NOTIFY_SOCKET` (not under systemd) nothing is sent.

use std::sync::Arc;

use kubelet::server::ApiState;
use kubelet_core::Runtime;
use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Tells the service manager the agent is up.
pub(crate) fn ready() {
    send(NotifyState::Ready);
}

/// Tells the service manager the agent is stopping.
pub(crate) fn stopping() {
    send(NotifyState::Stopping);
}

fn send(state: NotifyState<'_>) {
    if let Err(err) = sd_notify::notify(&[state]) {
        warn!(err = %err, "cannot notify the service manager");
    }
}

/// Pings the watchdog while `state` is healthy, when the unit has `WatchdogSec`.
pub(crate) fn spawn_watchdog<R: Runtime>(
    state: Arc<ApiState<R>>,
    cancel: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let timeout = sd_notify::watchdog_enabled()?;
    info!(?timeout, "pinging the systemd watchdog while healthy");
    Some(tokio::spawn(async move {
        let mut every = tokio::time::interval(timeout / 2);
        let mut was_healthy = true;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = every.tick() => {}
            }
            match state.health() {
                Ok(()) => {
                    send(NotifyState::Watchdog);
                    if !was_healthy {
                        info!("healthy again: pinging the systemd watchdog");
                    }
                    was_healthy = true;
                }
                Err(failed) if was_healthy => {
                    warn!(failed, "unhealthy: not pinging the systemd watchdog");
                    was_healthy = false;
                }
                Err(failed) => debug!(failed, "still unhealthy"),
            }
        }
    }))
}
