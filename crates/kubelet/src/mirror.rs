//! Mirror pods (upstream `pkg/kubelet/pod/mirror_client.go` and the static pod half of
//! `SyncPod`): the API server's read-only copy of each static pod, so a cluster sees it.
//!
//! The kubelet decides, a [`MirrorClient`] talks to the API server: [`mirror_action`] is the
//! rule, a pure function of the static pod and the mirror pod the API holds.

use k8s_openapi::api::core::v1::Pod;
use kubelet_core::{PodManager, hook::BoxFuture};

/// Where mirror pods are made and removed: the API server, in cluster mode
/// (`kubelet-rs` implements it over `kubelet-cluster`).
pub trait MirrorClient: Send + Sync + 'static {
    /// Creates the mirror pod of static pod `pod`; one already there with the pod's hash is success.
    fn create_mirror_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), String>>;

    /// Deletes mirror pod `namespace/name` at once, only if its UID is `uid` when one is given;
    /// `Ok(false)` when there was nothing to delete.
    fn delete_mirror_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, String>>;
}

/// What a sync of a static pod does about its mirror pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorAction {
    /// The mirror is there and current.
    Keep,
    /// No mirror yet: create it.
    Create,
    /// The mirror is outdated or being deleted: delete it (by this UID), then create it anew.
    Replace {
        /// The outdated mirror's UID.
        uid: String,
    },
}

/// Upstream's rule: a mirror that is being deleted, or that records another hash of the pod
/// than the static pod's own, is replaced; a missing one is created.
pub fn mirror_action(pod: &Pod, mirror: Option<&Pod>) -> MirrorAction {
    match mirror {
        None => MirrorAction::Create,
        Some(m) if m.metadata.deletion_timestamp.is_some() || !PodManager::is_mirror_pod_of(m, pod) => {
            MirrorAction::Replace { uid: m.metadata.uid.clone().unwrap_or_default() }
        }
        Some(_) => MirrorAction::Keep,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
        jiff::Timestamp,
    };
    use kubelet_core::types::annotations;

    use super::*;

    fn pod(uid: &str, annotations: &[(&str, &str)]) -> Pod {
        let annotations: BTreeMap<String, String> =
            annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Pod {
            metadata: ObjectMeta {
                name: Some("etcd-node-1".into()),
                namespace: Some("kube-system".into()),
                uid: Some(uid.into()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn mirrors_are_created_kept_while_current_and_replaced_when_outdated_or_deleted() {
        let static_pod = pod("s1", &[(annotations::CONFIG_SOURCE, "file"), (annotations::CONFIG_HASH, "h2")]);
        assert_eq!(mirror_action(&static_pod, None), MirrorAction::Create);
        let current = pod("m1", &[(annotations::CONFIG_SOURCE, "api"), (annotations::CONFIG_MIRROR, "h2")]);
        assert_eq!(mirror_action(&static_pod, Some(&current)), MirrorAction::Keep);
        let outdated = pod("m0", &[(annotations::CONFIG_SOURCE, "api"), (annotations::CONFIG_MIRROR, "h1")]);
        assert_eq!(mirror_action(&static_pod, Some(&outdated)), MirrorAction::Replace { uid: "m0".into() });
        let mut deleting = current;
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(mirror_action(&static_pod, Some(&deleting)), MirrorAction::Replace { uid: "m1".into() });
    }
}
