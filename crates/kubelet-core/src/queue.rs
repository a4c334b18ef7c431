//! The delayed work queue of pods to resync (upstream `pkg/kubelet/util/queue/work_queue.go`).
//!
//! Pod workers enqueue a pod with a delay when a sync completes; the sync loop's 1 s tick takes
//! every pod whose time has come.
//! Enqueueing a pod that is already queued replaces its time.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use tokio::time::Instant;

use crate::{PodUid, util::lock};

/// A thread-safe set of pods, each with the time it becomes due.
#[derive(Debug, Default)]
pub struct WorkQueue {
    due: Mutex<HashMap<PodUid, Instant>>,
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
