//! containerd's own services on the CRI socket, for what its CRI plugin cannot do.
//!
//! - Change hints: containerd 1.6 answers CRI `GetContainerEvents` with `Unimplemented`, but it
//!   serves its own `containerd.services.events.v1.Events/Subscribe` on the same socket.
//!   Its task and container events carry no pod status, so they are only hints: each one tells
//!   the PLEG to relist soon instead of at its next period. An exec's exit is none: it changes
//!   nothing a relist sees.
//! - A task left under a created container: a start cut short can leave containerd 1.6 with a
//!   running task under a container its CRI reports as created, which CRI `StopContainer` skips
//!   and `RemoveContainer` refuses. `remove_task` kills and deletes it through
//!   `containerd.services.tasks.v1.Tasks`.
//!
//! The messages below are written here from the protocol's field numbers; only the fields used
//! are declared (prost skips the others).

use std::time::Duration;

use kubelet_core::runtime::{ChangeHint, EventStreamError};
use tokio::sync::mpsc;
use tonic::{Code, Status, codegen::http::uri::PathAndQuery, metadata::MetadataValue, transport::Channel};
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

/// `containerd.services.events.v1.Envelope`, without its timestamp.
#[derive(Clone, PartialEq, prost::Message)]
struct Envelope {
    #[prost(string, tag = "2")]
    namespace: String,
    #[prost(string, tag = "3")]
    topic: String,
    #[prost(message, optional, tag = "4")]
    event: Option<Payload>,
}

/// `google.protobuf.Any`: the event, encoded.
#[derive(Clone, PartialEq, prost::Message)]
struct Payload {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `containerd.events.TaskExit`, its IDs only: `id` is the process's, which for a container's
/// own (init) process is the container's ID, and for an exec the exec's.
#[derive(Clone, PartialEq, prost::Message)]
struct TaskExit {
    #[prost(string, tag = "1")]
    container_id: String,
    #[prost(string, tag = "2")]
    id: String,
}

/// The hint `envelope` gives, if any: a task's exit or deletion is [`ChangeHint::Exited`], other
/// topics [`ChangeHint::Changed`]. An exec's exit (each exec probe's) gives none: nothing a
/// relist sees has changed, and with 100 containers probed by exec every 10 s, the relists it
/// caused were most of the agent's CPU for probing.
fn hint_of(envelope: &Envelope) -> Option<ChangeHint> {
    match envelope.topic.as_str() {
        "/tasks/exit" if is_exec_exit(envelope) => None,
        "/tasks/exit" | "/tasks/delete" => Some(ChangeHint::Exited),
        _ => Some(ChangeHint::Changed),
    }
}

/// Whether `envelope` is the exit of an exec's process rather than of a container's own.
fn is_exec_exit(envelope: &Envelope) -> bool {
    use prost::Message as _;
    let Some(payload) = &envelope.event else { return false };
    match TaskExit::decode(payload.value.as_slice()) {
        Ok(exit) => !exit.id.is_empty() && exit.id != exit.container_id,
        Err(_) => false,
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
                let hint = hint_of(&envelope);
                debug!(namespace = %envelope.namespace, topic = %envelope.topic, hint = ?hint, "containerd event");
                if let Some(hint) = hint
                    && send(&changed, hint).is_err()
                {
                    return Ok(());
                }
            }
            Ok(None) => return Err(EventStreamError::Closed),
            Err(status) => return Err(EventStreamError::Failed(Box::new(status))),
        }
    }
}

const KILL: &str = "/containerd.services.tasks.v1.Tasks/Kill";
const WAIT: &str = "/containerd.services.tasks.v1.Tasks/Wait";
const DELETE: &str = "/containerd.services.tasks.v1.Tasks/Delete";
/// The gRPC header that names the containerd namespace of a call.
const NAMESPACE_HEADER: &str = "containerd-namespace";
const SIGKILL: u32 = 9;

/// `containerd.services.tasks.v1.KillRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct KillRequest {
    #[prost(string, tag = "1")]
    container_id: String,
    #[prost(string, tag = "2")]
    exec_id: String,
    #[prost(uint32, tag = "3")]
    signal: u32,
    #[prost(bool, tag = "4")]
    all: bool,
}

/// `WaitRequest` without an exec ID, and `DeleteTaskRequest`: both name the task by field 1.
#[derive(Clone, PartialEq, prost::Message)]
struct TaskRequest {
    #[prost(string, tag = "1")]
    container_id: String,
}

/// A response whose fields are not read (`Empty`, `WaitResponse`, `DeleteResponse`).
#[derive(Clone, PartialEq, prost::Message)]
struct Ignored {}

/// One unary call to a containerd service in [`CRI_NAMESPACE`].
async fn call<Req: prost::Message + Send + Sync + 'static>(
    channel: Channel,
    method: &'static str,
    message: Req,
) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(NAMESPACE_HEADER, MetadataValue::from_static(CRI_NAMESPACE));
    let codec = tonic_prost::ProstCodec::<Req, Ignored>::default();
    grpc.unary(request, PathAndQuery::from_static(method), codec).await.map(drop)
}

/// `Ok` for a task that is gone already: NotFound from kill (process already finished), wait
/// or delete, which the CRI plugin's own exit handling may have done first.
fn gone_is_done(result: Result<(), Status>) -> Result<(), Status> {
    match result {
        Err(status) if status.code() == Code::NotFound => Ok(()),
        other => other,
    }
}

/// Kills the task containerd keeps under `container_id` (every process, SIGKILL), waits at most
/// `wait` for it to exit, and deletes it, so the container itself can then be removed.
///
/// A task that is already gone is success; a runtime that is not containerd answers
/// `Unimplemented`.
pub(crate) async fn remove_task(channel: Channel, container_id: &str, wait: Duration) -> Result<(), Status> {
    let task = || TaskRequest { container_id: container_id.to_owned() };
    let kill =
        KillRequest { container_id: container_id.to_owned(), exec_id: String::new(), signal: SIGKILL, all: true };
    gone_is_done(call(channel.clone(), KILL, kill).await)?;
    match tokio::time::timeout(wait, call(channel.clone(), WAIT, task())).await {
        Ok(result) => gone_is_done(result)?,
        Err(_) => return Err(Status::deadline_exceeded(format!("task {container_id} did not exit within {wait:?}"))),
    }
    gone_is_done(call(channel, DELETE, task()).await)
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

    fn envelope(topic: &str, event: Option<Payload>) -> Envelope {
        Envelope { namespace: CRI_NAMESPACE.to_owned(), topic: topic.to_owned(), event }
    }

    fn task_exit(container_id: &str, id: &str) -> Option<Payload> {
        use prost::Message;
        let exit = TaskExit { container_id: container_id.to_owned(), id: id.to_owned() };
        Some(Payload { type_url: "containerd.events.TaskExit".to_owned(), value: exit.encode_to_vec() })
    }

    #[test]
    fn exits_and_task_deletions_are_exit_hints() {
        let hints: Vec<Option<ChangeHint>> = TOPICS.iter().map(|topic| hint_of(&envelope(topic, None))).collect();
        let (changed, exited) = (Some(ChangeHint::Changed), Some(ChangeHint::Exited));
        assert_eq!(hints, [changed, changed, exited, exited, changed]);
    }

    #[test]
    fn an_execs_exit_is_no_hint_and_a_containers_own_is() {
        assert_eq!(hint_of(&envelope("/tasks/exit", task_exit("c1", "c1"))), Some(ChangeHint::Exited));
        assert_eq!(hint_of(&envelope("/tasks/exit", task_exit("c1", "exec-7f3a"))), None);
        // What cannot be read is a hint: a relist too many costs less than a change missed.
        let unreadable = Payload { type_url: "x".to_owned(), value: vec![0xff] };
        assert_eq!(hint_of(&envelope("/tasks/exit", Some(unreadable))), Some(ChangeHint::Exited));
    }

    #[test]
    fn a_kill_request_encodes_the_protocols_field_numbers() {
        use prost::Message;
        let kill = KillRequest { container_id: "c1".to_owned(), exec_id: String::new(), signal: SIGKILL, all: true };
        // container_id (1), signal (3) as a varint, all (4) as a varint; the empty exec_id is omitted.
        assert_eq!(kill.encode_to_vec(), [0x0a, 2, b'c', b'1', 0x18, 9, 0x20, 1]);
        assert_eq!(TaskRequest { container_id: "c1".to_owned() }.encode_to_vec(), [0x0a, 2, b'c', b'1']);
    }

    #[test]
    fn an_envelope_decodes_its_topic_namespace_and_event_and_skips_the_timestamp() {
        use prost::Message;
        // timestamp (1) {seconds: 5}, namespace (2), topic (3), event (4) as an Any {type_url}.
        let mut bytes = vec![0x0a, 0x02, 0x08, 0x05];
        bytes.extend([0x12, 6]);
        bytes.extend(b"k8s.io");
        bytes.extend([0x1a, 11]);
        bytes.extend(b"/tasks/exit");
        bytes.extend([0x22, 5, 0x0a, 3]);
        bytes.extend(b"x/y");
        let decoded = Envelope::decode(bytes.as_slice()).unwrap();
        let payload = Payload { type_url: "x/y".to_owned(), value: Vec::new() };
        assert_eq!(decoded, envelope("/tasks/exit", Some(payload)));
    }
}
