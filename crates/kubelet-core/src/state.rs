//! Shared state the sync loop consults: which sources are ready, whether the runtime is healthy,
//! and when the loop last made progress.

use std::{
    collections::BTreeSet,
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::{Source, runtime::RuntimeStatus, util::lock};

/// Why a component is not healthy, in upstream's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HealthError(pub String);

/// Tracks which config sources have sent their first snapshot (upstream `config.SourcesReady`).
///
/// Housekeeping and pod removal wait until every expected source is seen, so a pod is never killed
/// just because its source has not spoken yet.
#[derive(Debug)]
pub struct SourcesReady {
    expected: BTreeSet<Source>,
    seen: Mutex<BTreeSet<Source>>,
}

impl SourcesReady {
    /// Expects the given sources.
    pub fn new(expected: impl IntoIterator<Item = Source>) -> Self {
        SourcesReady { expected: expected.into_iter().collect(), seen: Mutex::new(BTreeSet::new()) }
    }

    /// Marks `source` as seen.
    pub fn add_source(&self, source: Source) {
        lock(&self.seen).insert(source);
    }

    /// Whether `source` has been seen.
    pub fn is_seen(&self, source: Source) -> bool {
        lock(&self.seen).contains(&source)
    }

    /// Whether every expected source has been seen.
    pub fn all_ready(&self) -> bool {
        let seen = lock(&self.seen);
        self.expected.iter().all(|s| seen.contains(s))
    }
}

/// A named health check whose failure makes the runtime unhealthy (for example the PLEG's).
pub type HealthCheck = Arc<dyn Fn() -> Result<(), HealthError> + Send + Sync>;

#[derive(Default)]
struct RuntimeInner {
    last_base_sync: Option<Instant>,
    runtime_error: Option<String>,
    network_error: Option<String>,
    checks: Vec<(String, HealthCheck)>,
}

/// The runtime's health as the kubelet tracks it (upstream `runtimeState`).
///
/// The sync loop does no work while [`RuntimeState::runtime_errors`] is non-empty.
pub struct RuntimeState {
    base_sync_threshold: Duration,
    inner: Mutex<RuntimeInner>,
}

impl fmt::Debug for RuntimeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("RuntimeState")
            .field("last_base_sync", &inner.last_base_sync)
            .field("runtime_error", &inner.runtime_error)
            .field("network_error", &inner.network_error)
            .field("checks", &inner.checks.len())
            .finish()
    }
}

impl Default for RuntimeState {
    /// Upstream's threshold: the runtime is down when it was last seen ready 30 s ago.
    fn default() -> Self {
        RuntimeState::new(Duration::from_secs(30))
    }
}

impl RuntimeState {
    /// A state that reports the runtime down when it was last seen ready more than `threshold` ago.
    pub fn new(threshold: Duration) -> Self {
        RuntimeState { base_sync_threshold: threshold, inner: Mutex::new(RuntimeInner::default()) }
    }

    /// Adds a health check; a failing check is a runtime error.
    pub fn add_health_check(&self, name: impl Into<String>, check: HealthCheck) {
        lock(&self.inner).checks.push((name.into(), check));
    }

    /// Records that the runtime was seen ready at `at`.
    pub fn set_runtime_sync(&self, at: Instant) {
        lock(&self.inner).last_base_sync = Some(at);
    }

    /// Records (or clears) a runtime error.
    pub fn set_runtime_error(&self, error: Option<String>) {
        lock(&self.inner).runtime_error = error;
    }

    /// Records (or clears) a network error.
    pub fn set_network_error(&self, error: Option<String>) {
        lock(&self.inner).network_error = error;
    }

    /// Applies the outcome of one runtime status poll at `now` (upstream `updateRuntimeUp`).
    pub fn update_from_status<E: fmt::Display>(&self, status: Result<&RuntimeStatus, E>, now: Instant) {
        let status = match status {
            Ok(status) => status,
            Err(err) => {
                self.set_runtime_error(Some(format!("container runtime status check failed: {err}")));
                return;
            }
        };
        let network = status.condition(crate::runtime::NETWORK_READY);
        self.set_network_error(match network {
            Some(c) if c.status => None,
            Some(c) => Some(format!(
                "container runtime network not ready: NetworkReady=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => Some("container runtime network not ready: NetworkReady condition missing".to_owned()),
        });
        match status.condition(crate::runtime::RUNTIME_READY) {
            Some(c) if c.status => {
                self.set_runtime_error(None);
                self.set_runtime_sync(now);
            }
            Some(c) => self.set_runtime_error(Some(format!(
                "container runtime not ready: RuntimeReady=false reason:{} message:{}",
                c.reason, c.message
            ))),
            None => {
                self.set_runtime_error(Some("container runtime not ready: RuntimeReady condition missing".to_owned()))
            }
        }
    }

    /// Everything that makes the runtime unusable now; empty when it is healthy.
    pub fn runtime_errors(&self) -> Vec<String> {
        let now = Instant::now();
        let inner = lock(&self.inner);
        let mut errors = Vec::new();
        match inner.last_base_sync {
            None => errors.push("container runtime status check may not have completed yet".to_owned()),
            Some(at) if now.saturating_duration_since(at) > self.base_sync_threshold => {
                errors.push("container runtime is down".to_owned());
            }
            Some(_) => {}
        }
        for (name, check) in &inner.checks {
            if let Err(err) = check() {
                errors.push(format!("{name} is not healthy: {err}"));
            }
        }
        errors.extend(inner.runtime_error.clone());
        errors
    }

    /// Why the runtime is down, once it has been checked at least once: the last status check
    /// failed or said not ready, or no check succeeded within the threshold. `None` when it is
    /// healthy and before the first check (start-up is not an outage).
    pub fn runtime_down(&self) -> Option<String> {
        let inner = lock(&self.inner);
        if let Some(error) = &inner.runtime_error {
            return Some(error.clone());
        }
        match inner.last_base_sync {
            Some(at) if Instant::now().saturating_duration_since(at) > self.base_sync_threshold => {
                Some("container runtime is down".to_owned())
            }
            _ => None,
        }
    }

    /// The network error, if any: pods without host networking cannot start while it is set.
    pub fn network_errors(&self) -> Vec<String> {
        lock(&self.inner).network_error.iter().cloned().collect()
    }
}

/// When the sync loop last made progress, for `/healthz` (upstream `SyncLoopHealthCheck`).
#[derive(Debug)]
pub struct LoopHealth {
    threshold: Duration,
    last: Mutex<Option<Instant>>,
}

impl LoopHealth {
    /// A monitor that reports the loop stuck after `max(2 x resync_interval, 5 min)` without progress.
    pub fn new(resync_interval: Duration) -> Self {
        LoopHealth { threshold: (resync_interval * 2).max(Duration::from_secs(300)), last: Mutex::new(None) }
    }

    /// Records progress now.
    pub fn mark(&self) {
        *lock(&self.last) = Some(Instant::now());
    }

    /// When progress was last recorded.
    pub fn last(&self) -> Option<Instant> {
        *lock(&self.last)
    }

    /// Healthy unless the loop made no progress for longer than the threshold.
    pub fn check(&self) -> Result<(), HealthError> {
        match self.last() {
            Some(at) if Instant::now().saturating_duration_since(at) > self.threshold => {
                Err(HealthError("sync Loop took longer than expected".to_owned()))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{NETWORK_READY, RUNTIME_READY, RuntimeCondition};

    fn status(runtime: bool, network: bool) -> RuntimeStatus {
        RuntimeStatus::new(vec![
            RuntimeCondition::new(RUNTIME_READY, runtime, if runtime { "" } else { "Down" }, ""),
            RuntimeCondition::new(
                NETWORK_READY,
                network,
                if network { "" } else { "NetworkPluginNotReady" },
                "cni config uninitialized",
            ),
        ])
    }

    #[test]
    fn sources_ready_once_every_expected_source_is_seen() {
        let s = SourcesReady::new([Source::File, Source::Http]);
        assert!(!s.all_ready());
        s.add_source(Source::File);
        assert!(!s.all_ready());
        s.add_source(Source::Api);
        assert!(!s.all_ready(), "an unexpected source does not count");
        s.add_source(Source::Http);
        assert!(s.all_ready());
        assert!(s.is_seen(Source::File));
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_state_before_first_sync_and_when_stale() {
        let rs = RuntimeState::default();
        assert_eq!(rs.runtime_errors(), ["container runtime status check may not have completed yet"]);
        rs.update_from_status(Ok::<_, String>(&status(true, true)), Instant::now());
        assert!(rs.runtime_errors().is_empty());
        assert!(rs.network_errors().is_empty());
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(rs.runtime_errors(), ["container runtime is down"]);
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_state_reports_not_ready_conditions_and_poll_errors() {
        let rs = RuntimeState::default();
        rs.update_from_status(Ok::<_, String>(&status(true, false)), Instant::now());
        assert!(rs.runtime_errors().is_empty());
        assert_eq!(rs.network_errors().len(), 1);
        assert!(rs.network_errors()[0].contains("NetworkPluginNotReady"));
        rs.update_from_status(Ok::<_, String>(&status(false, true)), Instant::now());
        assert!(rs.runtime_errors().iter().any(|e| e.contains("RuntimeReady=false")));
        rs.update_from_status(Err("connection refused"), Instant::now());
        assert!(rs.runtime_errors().iter().any(|e| e.contains("connection refused")));
        rs.update_from_status(Ok::<_, String>(&status(true, true)), Instant::now());
        assert!(rs.runtime_errors().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_down_ignores_start_up_and_reports_failures_and_staleness() {
        let rs = RuntimeState::default();
        assert_eq!(rs.runtime_down(), None, "not checked yet is not down");
        rs.update_from_status(Err("connect: no such file or directory"), Instant::now());
        assert!(rs.runtime_down().is_some_and(|e| e.contains("no such file")));
        rs.update_from_status(Ok::<_, String>(&status(true, true)), Instant::now());
        assert_eq!(rs.runtime_down(), None);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(rs.runtime_down().as_deref(), Some("container runtime is down"));
    }

    #[tokio::test(start_paused = true)]
    async fn failing_health_check_is_a_runtime_error() {
        let rs = RuntimeState::default();
        rs.set_runtime_sync(Instant::now());
        rs.add_health_check("PLEG", Arc::new(|| Err(HealthError("pleg has yet to be successful".into()))));
        assert_eq!(rs.runtime_errors(), ["PLEG is not healthy: pleg has yet to be successful"]);
    }

    #[tokio::test(start_paused = true)]
    async fn loop_health_threshold_is_at_least_five_minutes() {
        let h = LoopHealth::new(Duration::from_secs(60));
        assert!(h.check().is_ok(), "healthy before the loop starts");
        h.mark();
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(h.check().is_ok());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(h.check().unwrap_err().to_string(), "sync Loop took longer than expected");
        let long = LoopHealth::new(Duration::from_secs(600));
        long.mark();
        tokio::time::advance(Duration::from_secs(1000)).await;
        assert!(long.check().is_ok(), "threshold is 2 x resync when that is longer");
    }
}
