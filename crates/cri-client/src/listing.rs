//! The answers of a relist's two calls, `ListPodSandbox` and `ListContainers`, decoded into
//! messages that keep only what a listed pod carries ([`runtime::Pod`]).
//!
//! A relist lists every sandbox and container on the node, and while pods start the PLEG
//! relists as often as the runtime's events come, so the answers' decoding grows with the
//! pods squared. The generated messages decode every label and annotation of every item into
//! a hash map of owned strings, which was most of it.
//! These messages read the same bytes: their fields carry the generated ones' tags, the
//! fields a listed pod does not need are skipped as unknown ones, and the labels and
//! annotations are entries whose keys and values share the answer's buffer ([`Bytes`]); the
//! few a listed pod keeps are copied out when it is built.

use std::marker::PhantomData;

use kubelet_core::{
    PodUid,
    runtime::{self, Container, Sandbox},
};
use prost::bytes::{Buf as _, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use crate::{
    convert::{container_state, sandbox_state, timestamp},
    labels, pb,
};

/// The codec of a call whose answer is one of these messages: the request encoded as tonic's
/// own codec does, the answer decoded from the whole message taken out of the receive buffer
/// as one [`Bytes`], whose reads and slices are simpler than the buffer's own.
pub(crate) struct ListingCodec<Request, Answer>(PhantomData<(Request, Answer)>);

impl<Request, Answer> Default for ListingCodec<Request, Answer> {
    fn default() -> Self {
        ListingCodec(PhantomData)
    }
}

impl<Request, Answer> Codec for ListingCodec<Request, Answer>
where
    Request: prost::Message + Send + 'static,
    Answer: prost::Message + Default + Send + 'static,
{
    type Encode = Request;
    type Decode = Answer;
    type Encoder = ProstEncoder<Request>;
    type Decoder = ListingDecoder<Answer>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ListingDecoder(PhantomData)
    }
}

/// [`ListingCodec`]'s decoder.
pub(crate) struct ListingDecoder<Answer>(PhantomData<Answer>);

impl<Answer: prost::Message + Default> Decoder for ListingDecoder<Answer> {
    type Item = Answer;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Answer>, tonic::Status> {
        let message = buf.copy_to_bytes(buf.remaining());
        // As tonic's own codec answers a message that does not decode.
        Answer::decode(message).map(Some).map_err(|err| tonic::Status::internal(err.to_string()))
    }
}

/// An entry of a CRI string map (`map<string, string>` is a repeated message of a key, tag 1,
/// and a value, tag 2), unvalidated: only the entries a listed pod keeps are read as text.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Entry {
    #[prost(bytes = "bytes", tag = "1")]
    key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

/// The value of `key` among `entries`, if it is there and is text; the last one wins, as in
/// the generated messages' maps.
fn value_of<'a>(entries: &'a [Entry], key: &str) -> Option<&'a str> {
    let entry = entries.iter().rev().find(|entry| entry.key == key.as_bytes())?;
    std::str::from_utf8(&entry.value).ok()
}

/// `ListPodSandboxResponse` (`items`, tag 1).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListedSandboxes {
    #[prost(message, repeated, tag = "1")]
    pub(crate) items: Vec<ListedSandbox>,
}

/// `PodSandbox`: its ID, attempt, state, creation and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListedSandbox {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(message, optional, tag = "2")]
    metadata: Option<ListedSandboxMetadata>,
    #[prost(enumeration = "pb::PodSandboxState", tag = "3")]
    state: i32,
    #[prost(int64, tag = "4")]
    created_at: i64,
    #[prost(message, repeated, tag = "5")]
    labels: Vec<Entry>,
}

/// `PodSandboxMetadata`: the attempt alone.
#[derive(Clone, PartialEq, prost::Message)]
struct ListedSandboxMetadata {
    #[prost(uint32, tag = "4")]
    attempt: u32,
}

/// `ListContainersResponse` (`containers`, tag 1).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListedContainers {
    #[prost(message, repeated, tag = "1")]
    pub(crate) containers: Vec<ListedContainer>,
}

/// `Container`: its ID, name, image, state, creation, labels and annotations.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListedContainer {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(message, optional, tag = "3")]
    metadata: Option<ListedContainerMetadata>,
    #[prost(message, optional, tag = "4")]
    image: Option<ListedImage>,
    #[prost(string, tag = "5")]
    image_ref: String,
    #[prost(enumeration = "pb::ContainerState", tag = "6")]
    state: i32,
    #[prost(int64, tag = "7")]
    created_at: i64,
    #[prost(message, repeated, tag = "8")]
    labels: Vec<Entry>,
    #[prost(message, repeated, tag = "9")]
    annotations: Vec<Entry>,
}

/// `ContainerMetadata`: the name alone.
#[derive(Clone, PartialEq, prost::Message)]
struct ListedContainerMetadata {
    #[prost(string, tag = "1")]
    name: String,
}

/// `ImageSpec`: the image alone.
#[derive(Clone, PartialEq, prost::Message)]
struct ListedImage {
    #[prost(string, tag = "1")]
    image: String,
}

/// The UID of the pod a listed object's labels name (none for objects of other clients).
fn pod_uid_of(labels: &[Entry]) -> Option<PodUid> {
    value_of(labels, labels::POD_UID).filter(|uid| !uid.is_empty()).map(PodUid::new)
}

/// Pod `uid`, with no sandbox or container yet, named by a listed object's labels.
fn empty_pod_of(labels: &[Entry], uid: PodUid) -> runtime::Pod {
    let name = value_of(labels, labels::POD_NAME).unwrap_or_default();
    let namespace = value_of(labels, labels::POD_NAMESPACE).unwrap_or_default();
    runtime::Pod::new(uid, name, namespace)
}

impl ListedSandbox {
    /// The UID of the pod it belongs to, if it names one.
    pub(crate) fn pod_uid(&self) -> Option<PodUid> {
        pod_uid_of(&self.labels)
    }

    /// Its pod, `uid`, with no sandbox or container yet.
    pub(crate) fn empty_pod(&self, uid: PodUid) -> runtime::Pod {
        empty_pod_of(&self.labels, uid)
    }

    pub(crate) fn into_sandbox(self) -> Sandbox {
        let attempt = self.metadata.as_ref().map_or(0, |m| m.attempt);
        let mut sandbox = Sandbox::new(self.id, attempt, sandbox_state(self.state));
        sandbox.created_at = timestamp(self.created_at);
        sandbox
    }
}

impl ListedContainer {
    /// The UID of the pod it belongs to, if it names one.
    pub(crate) fn pod_uid(&self) -> Option<PodUid> {
        pod_uid_of(&self.labels)
    }

    /// Its pod, `uid`, with no sandbox or container yet.
    pub(crate) fn empty_pod(&self, uid: PodUid) -> runtime::Pod {
        empty_pod_of(&self.labels, uid)
    }

    pub(crate) fn into_container(self) -> Container {
        // Its label, else the CRI metadata's name.
        let name = value_of(&self.labels, labels::CONTAINER_NAME)
            .or_else(|| self.metadata.as_ref().map(|m| m.name.as_str()))
            .unwrap_or_default();
        let mut container = Container::new(self.id, name, container_state(self.state));
        container.image = self.image.map(|i| i.image).unwrap_or_default();
        container.image_id = self.image_ref;
        container.hash = value_of(&self.annotations, labels::CONTAINER_HASH)
            .and_then(|hash| u64::from_str_radix(hash, 16).ok())
            .unwrap_or(0);
        container.created_at = timestamp(self.created_at);
        container
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prost::Message as _;

    use super::*;

    fn map(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// The runtime's answer, encoded with the generated messages, decodes into the same listed
    /// pod, container and sandbox as the generated messages give.
    #[test]
    fn listed_messages_read_the_generated_ones_bytes() {
        let kubelet_labels =
            [(labels::POD_UID, "uid-1"), (labels::POD_NAME, "web"), (labels::POD_NAMESPACE, "default")];
        let sandbox = pb::PodSandbox {
            id: "sandbox-1".into(),
            metadata: Some(pb::PodSandboxMetadata {
                name: "web".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 2,
            }),
            state: pb::PodSandboxState::SandboxReady as i32,
            created_at: 1_700_000_000_000_000_000,
            labels: map(&[kubelet_labels.as_slice(), &[("app", "web"), ("io.cri-containerd.kind", "sandbox")]].concat()),
            annotations: map(&[("kubernetes.io/config.source", "file")]),
            runtime_handler: "runc".into(),
        };
        let container = pb::Container {
            id: "container-1".into(),
            pod_sandbox_id: "sandbox-1".into(),
            metadata: Some(pb::ContainerMetadata { name: "app".into(), attempt: 1 }),
            image: Some(pb::ImageSpec { image: "busybox:1.35".into(), ..Default::default() }),
            image_ref: "sha256:abc".into(),
            state: pb::ContainerState::ContainerExited as i32,
            created_at: 1_700_000_001_000_000_000,
            labels: map(&[kubelet_labels.as_slice(), &[(labels::CONTAINER_NAME, "app")]].concat()),
            annotations: map(&[(labels::CONTAINER_HASH, "1f"), (labels::CONTAINER_RESTART_COUNT, "1")]),
            image_id: "sha256:abc".into(),
        };
        let sandboxes = pb::ListPodSandboxResponse { items: vec![sandbox] }.encode_to_vec();
        let containers = pb::ListContainersResponse { containers: vec![container] }.encode_to_vec();

        let sandboxes = ListedSandboxes::decode(sandboxes.as_slice()).unwrap().items;
        let containers = ListedContainers::decode(containers.as_slice()).unwrap().containers;

        let uid = sandboxes[0].pod_uid().unwrap();
        let pod = sandboxes[0].empty_pod(uid.clone());
        assert_eq!((pod.uid.as_str(), pod.name.as_str(), pod.namespace.as_str()), ("uid-1", "web", "default"));
        assert!(pod.sandboxes.is_empty() && pod.containers.is_empty());
        let listed = sandboxes.into_iter().next().unwrap().into_sandbox();
        assert_eq!((listed.id.as_str(), listed.attempt, listed.state), ("sandbox-1", 2, runtime::SandboxState::Ready));
        assert_eq!(listed.created_at, timestamp(1_700_000_000_000_000_000));
        assert_eq!(containers[0].pod_uid(), Some(uid.clone()));
        assert_eq!(containers[0].empty_pod(uid).name, "web");
        let listed = containers.into_iter().next().unwrap().into_container();
        assert_eq!((listed.id.as_str(), listed.name.as_str()), ("container-1", "app"));
        assert_eq!((listed.image.as_str(), listed.image_id.as_str()), ("busybox:1.35", "sha256:abc"));
        assert_eq!((listed.state, listed.hash), (runtime::ContainerState::Exited, 0x1f));
        assert_eq!(listed.created_at, timestamp(1_700_000_001_000_000_000));
    }

    /// An object of another client (no pod UID label) belongs to no pod, and a container without
    /// the name label is named by its metadata.
    #[test]
    fn objects_without_the_kubelets_labels() {
        let container = pb::Container {
            id: "other".into(),
            metadata: Some(pb::ContainerMetadata { name: "from-metadata".into(), attempt: 0 }),
            labels: map(&[("app", "x"), (labels::POD_UID, "")]),
            ..Default::default()
        };
        let bytes = pb::ListContainersResponse { containers: vec![container] }.encode_to_vec();
        let listed = ListedContainers::decode(bytes.as_slice()).unwrap().containers;
        assert!(listed[0].pod_uid().is_none());
        assert_eq!(listed.into_iter().next().unwrap().into_container().name, "from-metadata");
    }
}
