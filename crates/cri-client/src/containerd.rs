//! Change hints from containerd's own event service, for runtimes whose CRI has no event stream.
//!
//! containerd 1.6 answers CRI `GetContainerEvents` with `Unimplemented`, but it serves its own
//! `containerd.services.events.v1.Events/Subscribe` on the same socket.
//! Its task and container events carry no pod status, so they are only hints: each one tells
//! the PLEG to relist soon instead of at its next period.
//! The two messages below are written here from the protocol's field numbers; only the fields
//! the hints need are decoded (prost skips the others).

use kubelet_core::runtime::{ChangeHint, EventStreamError};
use tokio::sync::mpsc;
use tonic::{Code, codegen::http::uri::PathAndQuery, transport::Channel};
use tracing::debug;

/// The containerd namespace of the CRI plugin's containers and sandboxes.
pub(crate) const CRI_NAMESPACE: &str = "k8s.io";

/// The event topics that change what a relist sees: a container or sandbox created, started,
/// exited or removed. The CRI plugin records an exit only after it has deleted the task, so the
/// task's deletion is a hint too, closer to when the exit shows in CRI.
pub(crate) const TOPICS: [&str; 5] =
    ["/containers/create", "/tasks/start", "/tasks/exit", "/tasks/delete", "/containers/delete"];

const SUBSCRIBE: &str = "/containerd.services.events.v1.Events/Subscribe";

/// `containerd.services.events.v1.SubscribeRequest`: filters are OR-ed, the conditions inside
/// one filter AND-ed.
#[derive(Clone, PartialEq, prost::Message)]
struct SubscribeRequest {
    #[prost(string, repeated, tag = "1")]
    filters: Vec<String>,
}

/// `containerd.services.events.v1.Envelope`, without its timestamp and payload.
#[derive(Clone, PartialEq, prost::Message)]
struct Envelope {
    #[prost(string, tag = "2")]
    namespace: String,
    #[prost(string, tag = "3")]
    topic: String,
}

/// The hint an event of `topic` gives: a task's exit or deletion is [`ChangeHint::Exited`].
fn hint_of(topic: &str) -> ChangeHint {
    match topic {
        "/tasks/exit" | "/tasks/delete" => ChangeHint::Exited,
        _ => ChangeHint::Changed,
    }
}

/// The filters for [`TOPICS`] in [`CRI_NAMESPACE`].
fn filters() -> Vec<String> {
    TOPICS.iter().map(|topic| format!("namespace=={CRI_NAMESPACE:?},topic=={topic:?}")).collect()
}

/// Sends one hint into `changed` per relevant containerd event until the stream fails or ends
/// (an error) or the receiver goes away (`Ok`).
///
/// Hints are coalesced: while `changed` is full, further ones are dropped, because one relist
/// covers them all.
pub(crate) async fn watch(channel: Channel, changed: mpsc::Sender<ChangeHint>) -> Result<(), EventStreamError> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| EventStreamError::Failed(Box::new(e)))?;
    let codec = tonic_prost::ProstCodec::<SubscribeRequest, Envelope>::default();
    let request = tonic::Request::new(SubscribeRequest { filters: filters() });
    let mut stream = match grpc.server_streaming(request, PathAndQuery::from_static(SUBSCRIBE), codec).await {
        Ok(response) => response.into_inner(),
        Err(status) if status.code() == Code::Unimplemented => return Err(EventStreamError::Unimplemented),
        Err(status) => return Err(EventStreamError::Failed(Box::new(status))),
    };
    // containerd sends its headers with the first event, so the call above returns only then.
    loop {
        match stream.message().await {
            Ok(Some(envelope)) => {
                debug!(namespace = %envelope.namespace, topic = %envelope.topic, "containerd event");
                if send(&changed, hint_of(&envelope.topic)).is_err() {
                    return Ok(());
                }
            }
            Ok(None) => return Err(EventStreamError::Closed),
            Err(status) => return Err(EventStreamError::Failed(Box::new(status))),
        }
    }
}

/// Sends a hint unless `changed` is full; an error when the receiver has gone.
fn send(changed: &mpsc::Sender<ChangeHint>, hint: ChangeHint) -> Result<(), ()> {
    match changed.try_send(hint) {
        Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Ok(()),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_select_each_topic_in_the_cri_namespace() {
        assert_eq!(
            filters(),
            [
                r#"namespace=="k8s.io",topic=="/containers/create""#,
                r#"namespace=="k8s.io",topic=="/tasks/start""#,
                r#"namespace=="k8s.io",topic=="/tasks/exit""#,
                r#"namespace=="k8s.io",topic=="/tasks/delete""#,
                r#"namespace=="k8s.io",topic=="/containers/delete""#,
            ]
        );
    }

    #[test]
    fn exits_and_task_deletions_are_exit_hints() {
        let hints: Vec<ChangeHint> = TOPICS.iter().map(|topic| hint_of(topic)).collect();
        assert_eq!(
            hints,
            [ChangeHint::Changed, ChangeHint::Changed, ChangeHint::Exited, ChangeHint::Exited, ChangeHint::Changed]
        );
    }

    #[test]
    fn an_envelope_decodes_its_topic_and_namespace_and_skips_the_rest() {
        use prost::Message;
        // timestamp (1) {seconds: 5}, namespace (2), topic (3), event (4) as an Any {type_url}.
        let mut bytes = vec![0x0a, 0x02, 0x08, 0x05];
        bytes.extend([0x12, 6]);
        bytes.extend(b"k8s.io");
        bytes.extend([0x1a, 11]);
        bytes.extend(b"/tasks/exit");
        bytes.extend([0x22, 5, 0x0a, 3]);
        bytes.extend(b"x/y");
        let envelope = Envelope::decode(bytes.as_slice()).unwrap();
        assert_eq!(envelope, Envelope { namespace: "k8s.io".to_owned(), topic: "/tasks/exit".to_owned() });
    }
}
