//! The delayed work queue of pods to resync (upstream `pkg/kubelet/util/queue/work_queue.go`).
//!
//! Pod workers enqueue a pod with a delay when a sync completes; the sync loop's 1 s tick takes
//! every pod whose time has come.
//! Enqueueing a pod that is already queued replaces its time.
//! [`WorkQueue::enqueue_now`] also wakes the loop at once, for a change the pod should follow
//! without waiting for the tick (an API object one of its volumes holds); upstream has no such
//! wake, and its pods wait up to the tick.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use tokio::{sync::Notify, time::Instant};

use crate::{PodUid, util::lock};

/// A thread-safe set of pods, each with the time it becomes due.
#[derive(Debug, Default)]
pub struct WorkQueue {
    due: Mutex<HashMap<PodUid, Instant>>,
    /// Wakes the sync loop for a pod queued with [`WorkQueue::enqueue_now`].
    wake: Notify,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Self {
        WorkQueue::default()
    }

    /// Queues `uid` to become due after `delay`; a pod already due sooner keeps its earlier time.
    pub fn enqueue(&self, uid: PodUid, delay: Duration) {
        let at = Instant::now() + delay;
        lock(&self.due).entry(uid).and_modify(|due| *due = (*due).min(at)).or_insert(at);
    }

    /// Queues `uid` as due now and wakes the sync loop ([`WorkQueue::woken`]), which syncs it
    /// at once rather than at its next tick.
    pub fn enqueue_now(&self, uid: PodUid) {
        self.enqueue(uid, Duration::ZERO);
        self.wake.notify_one();
    }

    /// Resolves once a pod was queued with [`WorkQueue::enqueue_now`] since the last time it
    /// resolved (a wake that came while nobody waited is kept).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Removes and returns every pod whose time has come.
    pub fn take_due(&self) -> Vec<PodUid> {
        let now = Instant::now();
        let mut due = lock(&self.due);
        let mut ready = Vec::new();
        due.retain(|uid, at| {
            let keep = *at > now;
            if !keep {
                ready.push(uid.clone());
            }
            keep
        });
        ready
    }

    /// Drops `uid` from the queue.
    pub fn remove(&self, uid: &PodUid) {
        lock(&self.due).remove(uid);
    }

    /// The number of queued pods.
    pub fn len(&self) -> usize {
        lock(&self.due).len()
    }

    /// Whether no pod is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn items_become_due_after_their_delay() {
        let q = WorkQueue::new();
        q.enqueue(PodUid::new("a"), Duration::from_secs(1));
        q.enqueue(PodUid::new("b"), Duration::from_secs(3));
        q.enqueue(PodUid::new("now"), Duration::ZERO);
        assert_eq!(q.take_due(), [PodUid::new("now")]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.take_due(), [PodUid::new("a")]);
        assert!(q.take_due().is_empty(), "taken items are gone");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.take_due(), [PodUid::new("b")]);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_due_time_wins() {
        let q = WorkQueue::new();
        q.enqueue(PodUid::new("a"), Duration::from_secs(10));
        q.enqueue(PodUid::new("a"), Duration::from_secs(3));
        q.enqueue(PodUid::new("a"), Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(q.take_due().is_empty());
        assert_eq!(q.len(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.take_due(), [PodUid::new("a")]);
        q.enqueue(PodUid::new("b"), Duration::from_secs(1));
        q.remove(&PodUid::new("b"));
        assert!(q.is_empty());
    }
}
