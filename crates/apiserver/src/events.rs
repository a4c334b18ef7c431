//! Events to the API server (upstream client-go `tools/record`, `events_cache.go`), correlated
//! as upstream's kubelet does before it sends them:
//!
//! - aggregation: once 10 events that differ only by message arrive within 10 minutes about the
//!   same object with the same reason, further ones become one event whose message starts with
//!   `(combined from similar events): `;
//! - de-duplication: an event seen before (same object, type, reason and message) is not
//!   created again; the first one's `count` and `lastTimestamp` are patched;
//! - spam filtering: each object may have a burst of 25 events, refilled at one per 5 minutes.
//!
//! [`Correlator`] holds these rules as a pure state machine over the time it is given;
//! [`send`] puts it to work. Each of its caches is bounded (4,096 entries, oldest out first).

use std::collections::{HashMap, VecDeque};

use k8s_openapi::{
    api::core::v1::{Event as ApiEvent, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use kubelet_core::events::Event;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Entries each cache keeps.
pub const CACHE_ENTRIES: usize = 4096;
/// Distinct messages within [`AGGREGATE_WINDOW_SECONDS`] before similar events are combined.
pub const AGGREGATE_MAX_EVENTS: usize = 10;
/// The aggregation window.
pub const AGGREGATE_WINDOW_SECONDS: i64 = 600;
/// Events an object may have at once.
pub const SPAM_BURST: f64 = 25.0;
/// The refill of an object's budget: one event per 300 s.
pub const SPAM_REFILL_PER_SECOND: f64 = 1.0 / 300.0;
/// The aggregated event's message prefix.
pub const COMBINED: &str = "(combined from similar events): ";

/// A map that keeps its newest `CACHE_ENTRIES` keys.
#[derive(Debug)]
struct Bounded<V> {
    map: HashMap<String, V>,
    order: VecDeque<String>,
}

impl<V> Default for Bounded<V> {
    fn default() -> Self {
        Bounded { map: HashMap::new(), order: VecDeque::new() }
    }
}

impl<V> Bounded<V> {
    fn entry(&mut self, key: &str, new: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(key) {
            if self.order.len() == CACHE_ENTRIES
                && let Some(oldest) = self.order.pop_front()
            {
                self.map.remove(&oldest);
            }
            self.order.push_back(key.to_owned());
        }
        self.map.entry(key.to_owned()).or_insert_with(new)
    }
}

/// Similar events seen lately.
#[derive(Debug)]
struct Aggregate {
    messages: Vec<String>,
    last: Timestamp,
}

/// An event sent before: its name, count and first time.
#[derive(Clone, Debug)]
struct Sent {
    name: String,
    count: i32,
    first: Timestamp,
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

/// What to do with an event.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Create this event.
    Create(Box<ApiEvent>),
    /// Patch the event named `name` (in `namespace`) to this count, last time and message.
    Patch {
        /// The namespace of the event.
        namespace: String,
        /// Its name.
        name: String,
        /// The new count.
        count: i32,
        /// The new last time.
        last: Timestamp,
        /// The message.
        message: String,
    },
    /// Drop it: the object's budget is spent, or the event is not about an API object.
    Skip,
}

/// Upstream's event correlator, for events of `component` (`kubelet`) on node `host`.
#[derive(Debug)]
pub struct Correlator {
    component: String,
    host: String,
    aggregates: Bounded<Aggregate>,
    sent: Bounded<Sent>,
    buckets: Bounded<Bucket>,
}

fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

impl Correlator {
    /// A correlator for events from `component` on `host`.
    pub fn new(component: impl Into<String>, host: impl Into<String>) -> Self {
        Correlator {
            component: component.into(),
            host: host.into(),
            aggregates: Bounded::default(),
            sent: Bounded::default(),
            buckets: Bounded::default(),
        }
    }

    /// The API's reference to the object of `event`: pods, and the Node (whose UID upstream
    /// gives as its name); other objects (manifest files) are not API objects.
    fn involved(event: &Event) -> Option<ObjectReference> {
        let object = &event.object;
        let (namespace, uid) = match object.kind.as_str() {
            "Pod" => (Some(object.namespace.clone()), object.uid.clone()),
            "Node" => (None, object.name.clone()),
            _ => return None,
        };
        Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some(object.kind.clone()),
            name: Some(object.name.clone()),
            namespace,
            uid: Some(uid),
            ..ObjectReference::default()
        })
    }

    /// What to do with `event`, happening at `now`; the outcome is taken as done.
    pub fn correlate(&mut self, event: &Event, now: Timestamp) -> Outcome {
        let Some(involved) = Correlator::involved(event) else { return Outcome::Skip };
        let object_key = format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
            self.component,
            self.host,
            event.object.kind,
            involved.namespace.as_deref().unwrap_or_default(),
            event.object.name,
            involved.uid.as_deref().unwrap_or_default()
        );
        let aggregate_key = format!("{object_key}\u{0}{}\u{0}{}", event.kind, event.reason);
        // Aggregation: the tenth distinct message within the window turns into the combined event.
        let aggregate = self.aggregates.entry(&aggregate_key, || Aggregate { messages: Vec::new(), last: now });
        if seconds(aggregate.last, now) > AGGREGATE_WINDOW_SECONDS as f64 {
            aggregate.messages.clear();
        }
        aggregate.last = now;
        if !aggregate.messages.contains(&event.message) {
            aggregate.messages.push(event.message.clone());
        }
        let (message, key) = if aggregate.messages.len() < AGGREGATE_MAX_EVENTS {
            (event.message.clone(), format!("{aggregate_key}\u{0}{}", event.message))
        } else {
            aggregate.messages.pop();
            (format!("{COMBINED}{}", event.message), aggregate_key)
        };
        // Spam filter: the object's token bucket.
        let bucket = self.buckets.entry(&object_key, || Bucket { tokens: SPAM_BURST, at: now });
        bucket.tokens = (bucket.tokens + seconds(bucket.at, now) * SPAM_REFILL_PER_SECOND).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Outcome::Skip;
        }
        bucket.tokens -= 1.0;
        // De-duplication: an event seen before is counted on the first one.
        let namespace = involved.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".to_owned());
        let nanos = now.as_nanosecond();
        let fresh = Sent { name: format!("{}.{nanos:x}", event.object.name), count: 0, first: now };
        let sent = self.sent.entry(&key, || fresh);
        sent.count += 1;
        if sent.count > 1 {
            return Outcome::Patch { namespace, name: sent.name.clone(), count: sent.count, last: now, message };
        }
        Outcome::Create(Box::new(ApiEvent {
            metadata: ObjectMeta { name: Some(sent.name.clone()), namespace: Some(namespace), ..ObjectMeta::default() },
            involved_object: involved,
            reason: Some(event.reason.clone()),
            message: Some(message),
            type_: Some(event.kind.to_string()),
            count: Some(1),
            first_timestamp: Some(Time(sent.first)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            source: Some(EventSource { component: Some(self.component.clone()), host: Some(self.host.clone()) }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            ..ApiEvent::default()
        }))
    }
}

/// How many events may wait for the API server before new ones are dropped (upstream's
/// broadcaster queue).
pub const QUEUE: usize = 1000;

/// Sends the events of `events` to the API server until `cancel` or until the channel closes,
/// correlated by a [`Correlator`] for `kubelet` on `host`. A failed request drops its event
/// (as upstream's, after its retries), logged at debug level.
pub async fn send(client: Client, host: String, mut events: mpsc::Receiver<Event>, cancel: CancellationToken) {
    let mut correlator = Correlator::new("kubelet", host);
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.recv() => match event { Some(event) => event, None => return },
        };
        let outcome = correlator.correlate(&event, kubelet_core::clock::wall_now());
        let result = match outcome {
            Outcome::Skip => continue,
            Outcome::Create(api_event) => {
                let namespace = api_event.metadata.namespace.clone().unwrap_or_default();
                Api::<ApiEvent>::namespaced(client.clone(), &namespace)
                    .create(&PostParams::default(), &api_event)
                    .await
                    .map(drop)
            }
            Outcome::Patch { namespace, name, count, last, message } => {
                let patch = json!({ "count": count, "lastTimestamp": Time(last), "message": message });
                let api = Api::<ApiEvent>::namespaced(client.clone(), &namespace);
                api.patch(&name, &PatchParams::default(), &Patch::Strategic(patch)).await.map(drop)
            }
        };
        if let Err(err) = result {
            debug!(reason = %event.reason, error = %err, "cannot send an event to the API server");
        }
    }
}

#[cfg(test)]
mod tests {
    use kubelet_core::events::{EventType, ObjectRef};

    use super::*;

    fn pod_event(reason: &str, message: &str) -> Event {
        let mut object = ObjectRef::other("Pod", "web");
        object.namespace = "default".into();
        object.uid = "u1".into();
        Event::new(EventType::Warning, reason, message, object)
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_repeated_event_is_counted_on_the_first_one() {
        let mut c = Correlator::new("kubelet", "node-1");
        let Outcome::Create(first) = c.correlate(&pod_event("BackOff", "Back-off restarting"), at(0)) else {
            panic!("the first is created")
        };
        assert_eq!(first.count, Some(1));
        assert_eq!(first.source.as_ref().unwrap().host.as_deref(), Some("node-1"));
        assert_eq!(first.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(first.metadata.namespace.as_deref(), Some("default"));
        let name = first.metadata.name.unwrap();
        assert!(name.starts_with("web."), "{name}");
        match c.correlate(&pod_event("BackOff", "Back-off restarting"), at(10)) {
            Outcome::Patch { name: patched, count, last, .. } => {
                assert_eq!((patched, count, last), (name, 2, at(10)));
            }
            other => panic!("a patch, not {other:?}"),
        }
    }

    #[test]
    fn ten_messages_of_one_reason_within_ten_minutes_combine() {
        let mut c = Correlator::new("kubelet", "node-1");
        for i in 0..9 {
            assert!(matches!(c.correlate(&pod_event("Failed", &format!("error {i}")), at(i)), Outcome::Create(_)));
        }
        let Outcome::Create(combined) = c.correlate(&pod_event("Failed", "error 9"), at(9)) else { panic!() };
        assert_eq!(combined.message.as_deref(), Some("(combined from similar events): error 9"));
        match c.correlate(&pod_event("Failed", "error 10"), at(10)) {
            Outcome::Patch { message, count, .. } => {
                assert_eq!((message.as_str(), count), ("(combined from similar events): error 10", 2));
            }
            other => panic!("the combined event is counted, not {other:?}"),
        }
        // After the window, messages count afresh.
        assert!(matches!(
            c.correlate(&pod_event("Failed", "error 11"), at(10 + AGGREGATE_WINDOW_SECONDS + 1)),
            Outcome::Create(e) if e.message.as_deref() == Some("error 11")
        ));
    }

    #[test]
    fn an_object_gets_a_burst_of_25_then_one_event_per_five_minutes() {
        let mut c = Correlator::new("kubelet", "node-1");
        let sent = (0..40).filter(|i| c.correlate(&pod_event(&format!("R{i}"), "m"), at(0)) != Outcome::Skip).count();
        assert_eq!(sent, 25);
        assert_eq!(c.correlate(&pod_event("Late", "m"), at(100)), Outcome::Skip, "a third of a token");
        assert_ne!(c.correlate(&pod_event("Later", "m"), at(300)), Outcome::Skip, "a token after 300 s");
        // Other objects have their own budget; files are no API objects.
        let mut other = pod_event("R0", "m");
        other.object.name = "db".into();
        assert_ne!(c.correlate(&other, at(300)), Outcome::Skip);
        let file = Event::new(EventType::Warning, "FailedValidation", "bad", ObjectRef::other("File", "/x.yaml"));
        assert_eq!(c.correlate(&file, at(300)), Outcome::Skip);
    }
}
