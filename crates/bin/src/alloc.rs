//! Keeps the memory allocator from holding memory an idle agent no longer needs.
//!
//! glibc's malloc gives a thread that meets a locked arena a new one, up to eight per core, and
//! keeps what is freed in each arena for reuse. A burst of pod start-ups spread over the runtime's
//! threads so leaves memory resident in many arenas that an idle agent never needs again.
//! A node agent does little allocation at once, so two arenas cost it no measurable contention.
//! What is freed in the middle of an arena stays resident until `malloc_trim` returns it, so the
//! agent trims once pods have changed (started, stopped, removed) and no change has followed for
//! a while ([`trim_after_changes`]): work after a burst, none while idle. A burst of 110 pod
//! start-ups left 12.5 MiB of anonymous memory resident, 8.2 MiB after a trim.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet::StatusSink;
use kubelet_core::PodUid;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Arenas the agent's allocator may use (glibc's default here: 8 per core).
pub(crate) const ARENAS: i32 = 2;

/// What `limit_arenas` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arenas {
    /// Bounded to `ARENAS`.
    Limited,
    /// The user chose with `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES`; left as they set it.
    UserChoice,
    /// Not glibc, or glibc refused; the allocator's default stands.
    Default,
}

/// Bounds glibc's arenas to `ARENAS` unless the environment already chose a bound.
/// Call it before any thread is spawned: a thread that already has an arena keeps it.
pub(crate) fn limit_arenas() -> Arenas {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if user_chose(std::env::var_os("MALLOC_ARENA_MAX").is_some(), &tunables) {
        return Arenas::UserChoice;
    }
    set_arena_max()
}

/// Whether the environment already bounds the arenas.
fn user_chose(malloc_arena_max: bool, glibc_tunables: &str) -> bool {
    malloc_arena_max || glibc_tunables.split(':').any(|t| t.starts_with("glibc.malloc.arena_max="))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // Reason: mallopt is glibc's only in-process way to bound its arenas.
fn set_arena_max() -> Arenas {
    // SAFETY: mallopt takes two integers and changes a malloc parameter under malloc's own lock;
    // it touches no memory of ours, and M_ARENA_MAX is a parameter this glibc knows.
    let done = unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
    if done == 1 { Arenas::Limited } else { Arenas::Default }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max() -> Arenas {
    Arenas::Default
}

/// How long after the last pod change the allocator is trimmed, so a burst of changes (a
/// manifest directory filled or emptied, a node drained) is followed by one trim.
pub(crate) const TRIM_QUIET: Duration = Duration::from_secs(5);

/// Returns the allocator's free memory to the system; whether any was returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // Reason: malloc_trim is glibc's only way to return memory freed inside its arenas.
pub(crate) fn trim() -> bool {
    // SAFETY: malloc_trim takes an integer and works under malloc's own locks; it frees only
    // pages that malloc itself holds as free, so no memory of ours changes.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the allocator's free memory to the system; whether any was returned.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim() -> bool {
    false
}

/// A status sink that wakes [`trim_after_changes`] each time a pod's status changes or the
/// kubelet forgets a pod.
pub(crate) struct PodChanges(pub(crate) Arc<Notify>);

impl StatusSink for PodChanges {
    fn status_changed(&self, _pod: &Pod, _status: &PodStatus, _version: u64) {
        // A permit is kept when the task is not waiting, so no change is missed.
        self.0.notify_one();
    }

    fn pod_removed(&self, _uid: &PodUid) {
        self.0.notify_one();
    }
}

/// Calls `trim` once `quiet` has passed since the last of a burst of pod changes, until `cancel`.
pub(crate) async fn trim_after_changes(
    changes: Arc<Notify>,
    quiet: Duration,
    mut trim: impl FnMut(),
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = changes.notified() => {}
        }
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = changes.notified() => {}
                () = tokio::time::sleep(quiet) => break,
            }
        }
        trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_the_user_set_is_kept() {
        assert!(user_chose(true, ""));
        assert!(user_chose(false, "glibc.malloc.arena_max=4"));
        assert!(user_chose(false, "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1"));
        assert!(!user_chose(false, "glibc.malloc.arena_test=4"));
        assert!(!user_chose(false, ""));
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_bound() {
        // The test harness has threads already; mallopt still accepts the parameter.
        assert_eq!(set_arena_max(), Arenas::Limited);
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_trim_returns_what_was_freed_inside_the_heap() {
        // Every other 64 KiB block freed: holes between live blocks, whose pages free() keeps and
        // only a trim returns.
        let mut blocks: Vec<Option<Vec<u8>>> = (0..128).map(|i| Some(vec![i as u8; 64 << 10])).collect();
        for block in blocks.iter_mut().step_by(2) {
            *block = None;
        }
        assert!(trim(), "4 MiB freed between live blocks is returned");
        drop(blocks);
    }

    /// Counts the trims of a `trim_after_changes` task.
    fn counting() -> (Arc<std::sync::atomic::AtomicUsize>, impl FnMut()) {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = count.clone();
        (count, move || _ = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_pod_changes_is_followed_by_one_trim_after_the_quiet_time() {
        let (changes, cancel) = (Arc::new(Notify::new()), CancellationToken::new());
        let (trims, trim) = counting();
        let task = tokio::spawn(trim_after_changes(changes.clone(), TRIM_QUIET, trim, cancel.clone()));
        let sink = PodChanges(changes);
        let trims = move || trims.load(std::sync::atomic::Ordering::SeqCst);

        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(trims(), 0, "no trim while nothing changes");
        // Pods start: their statuses change.
        let pod = Pod::default();
        for _ in 0..10 {
            sink.status_changed(&pod, &PodStatus::default(), 1);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(trims(), 0, "not while pods change");
        tokio::time::sleep(TRIM_QUIET).await;
        assert_eq!(trims(), 1, "one trim after the start-ups");

        // Pods are removed.
        for _ in 0..20 {
            sink.pod_removed(&PodUid::new("a"));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(trims(), 1, "not while removals go on");
        tokio::time::sleep(TRIM_QUIET).await;
        assert_eq!(trims(), 2, "one trim after the burst");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(trims(), 2, "and none after it");

        sink.pod_removed(&PodUid::new("b"));
        tokio::time::sleep(TRIM_QUIET + Duration::from_millis(1)).await;
        assert_eq!(trims(), 3, "a later removal gets its own");
        cancel.cancel();
        task.await.unwrap();
    }
}
