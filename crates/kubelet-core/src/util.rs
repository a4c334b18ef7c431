//! Small private helpers shared by the core modules.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering the data if a previous holder panicked.
///
/// Every critical section in this crate leaves its data consistent before it can panic (they
/// only insert, remove or overwrite whole entries), so a poisoned lock still guards valid data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) use crate::clock::wall_now;
