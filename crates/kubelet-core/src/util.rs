//! Small private helpers shared by the core modules.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering the data if a previous holder panicked.
///
/// Every critical section in this crate leaves its data consistent before it can panic (they
/// only insert, remove or overwrite whole entries), so a poisoned lock still guards valid data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The wall-clock time now, as the timestamps the API and the runtime use.
///
/// Wall-clock readings only label statuses; every timer and timeout uses tokio time.
pub(crate) fn wall_now() -> k8s_openapi::jiff::Timestamp {
    use k8s_openapi::jiff::Timestamp;
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    let nanos = i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0);
    Timestamp::new(secs, nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}
