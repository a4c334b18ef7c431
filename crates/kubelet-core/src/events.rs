//! Events: what the kubelet tells users about objects (upstream's `record.EventRecorder`).
//!
//! Sources and the kubelet record events through [`EventRecorder`]; [`RingRecorder`] logs each
//! event through `tracing`, keeps the most recent ones in memory for the node binary's local
//! API, and hands each to the recorders it forwards to (in cluster mode, the API server's).

use std::{
    collections::VecDeque,
    fmt,
    sync::{Arc, Mutex},
};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};

use crate::util::{lock, wall_now};

/// Whether an event is routine or a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Routine.
    Normal,
    /// Something went wrong.
    Warning,
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        })
    }
}

/// The object an event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ObjectRef {
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Namespace, if namespaced.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, if known.
    pub uid: String,
}

impl ObjectRef {
    /// A reference to a pod.
    pub fn pod(pod: &Pod) -> Self {
        ObjectRef {
            kind: "Pod".to_owned(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }

    /// A reference to something that is not an API object, such as a manifest file.
    pub fn other(kind: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectRef { kind: kind.into(), name: name.into(), ..ObjectRef::default() }
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Normal or Warning.
    pub kind: EventType,
    /// Machine-readable reason, as upstream spells it (`FailedValidation`, `Pulled`, ...).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// The object concerned.
    pub object: ObjectRef,
    /// When it happened.
    pub timestamp: Timestamp,
}

impl Event {
    /// An event happening now.
    pub fn new(kind: EventType, reason: impl Into<String>, message: impl Into<String>, object: ObjectRef) -> Self {
        Event { kind, reason: reason.into(), message: message.into(), object, timestamp: wall_now() }
    }
}

/// Where events go.
pub trait EventRecorder: Send + Sync {
    /// Records one event; must not block.
    fn record(&self, event: Event);
}

/// Logs events, keeps the most recent ones in memory, and forwards each.
pub struct RingRecorder {
    capacity: usize,
    events: Mutex<VecDeque<Event>>,
    forward: Mutex<Vec<Arc<dyn EventRecorder>>>,
}

impl fmt::Debug for RingRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingRecorder").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Default for RingRecorder {
    /// Keeps the last 1,000 events.
    fn default() -> Self {
        RingRecorder::new(1000)
    }
}

impl RingRecorder {
    /// Keeps the last `capacity` events.
    pub fn new(capacity: usize) -> Self {
        RingRecorder { capacity: capacity.max(1), events: Mutex::new(VecDeque::new()), forward: Mutex::default() }
    }

    /// Hands every event recorded from now on to `recorder` as well.
    pub fn forward_to(&self, recorder: Arc<dyn EventRecorder>) {
        lock(&self.forward).push(recorder);
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.events).iter().cloned().collect()
    }

    /// The events kept about the object with this UID, oldest first.
    pub fn events_for(&self, uid: &str) -> Vec<Event> {
        lock(&self.events).iter().filter(|e| e.object.uid == uid).cloned().collect()
    }
}

impl EventRecorder for RingRecorder {
    fn record(&self, event: Event) {
        match event.kind {
            EventType::Normal => tracing::info!(
                reason = %event.reason, object.kind = %event.object.kind, object.namespace = %event.object.namespace,
                object.name = %event.object.name, "{}", event.message
            ),
            EventType::Warning => tracing::warn!(
                reason = %event.reason, object.kind = %event.object.kind, object.namespace = %event.object.namespace,
                object.name = %event.object.name, "{}", event.message
            ),
        }
        for recorder in lock(&self.forward).iter() {
            recorder.record(event.clone());
        }
        let mut events = lock(&self.events);
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest_events() {
        let ring = RingRecorder::new(2);
        for i in 0..3 {
            ring.record(Event::new(EventType::Warning, "R", format!("m{i}"), ObjectRef::other("File", "x")));
        }
        let messages: Vec<_> = ring.events().into_iter().map(|e| e.message).collect();
        assert_eq!(messages, ["m1", "m2"]);
    }
}
