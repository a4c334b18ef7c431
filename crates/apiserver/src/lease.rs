//! The node lease (upstream `k8s.io/component-helpers/apimachinery/lease`): a `Lease` named
//! after the node in `kube-node-lease`, owned by the Node, renewed every quarter of its
//! duration, with optimistic concurrency (an update carries the `resourceVersion` it read).

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
    jiff::Timestamp,
};

/// The namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";
/// The lease's duration (`nodeLeaseDurationSeconds`, 40).
pub const DURATION_SECONDS: i32 = 40;
/// How often the lease is renewed: a quarter of its duration (upstream's
/// `nodeLeaseRenewIntervalFraction`), 10 s by default ([`renew_interval`]).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// Immediate retries of a failed renewal before waiting for the next interval.
pub const MAX_UPDATE_RETRIES: u32 = 5;
/// The longest wait between attempts to create or read the lease.
pub const MAX_BACKOFF: Duration = Duration::from_secs(7);

/// How often a lease of `duration_seconds` is renewed: a quarter of its duration.
pub fn renew_interval(duration_seconds: i32) -> Duration {
    Duration::from_millis(u64::try_from(duration_seconds).unwrap_or(0).max(1) * 250)
}

/// The lease of node `node` (whose UID is `node_uid`, when the Node is known, so the lease goes
/// with it), of `duration_seconds`, renewed at `now`.
pub fn new_lease(node: &str, node_uid: Option<&str>, duration_seconds: i32, now: Timestamp) -> Lease {
    let owner = node_uid.map(|uid| OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_owned(),
        uid: uid.to_owned(),
        ..OwnerReference::default()
    });
    Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_owned()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// `base` (the lease as last read, with its `resourceVersion`) renewed at `now` by `node` for
/// `duration_seconds`: the update the API server accepts only if nobody changed the lease since.
pub fn renewed(base: &Lease, node: &str, node_uid: Option<&str>, duration_seconds: i32, now: Timestamp) -> Lease {
    let mut lease = base.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_owned());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(MicroTime(now));
    if lease.metadata.owner_references.as_ref().is_none_or(Vec::is_empty) {
        lease.metadata.owner_references = new_lease(node, node_uid, duration_seconds, now).metadata.owner_references;
    }
    lease
}

/// The wait after `previous` failed attempts to create or read the lease (upstream's
/// `backoffEnsureLease`): 200 ms, doubling, at most [`MAX_BACKOFF`].
pub fn backoff(previous: u32) -> Duration {
    let millis = 100u64.saturating_mul(2u64.saturating_pow(previous.saturating_add(1)));
    Duration::from_millis(millis).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    #[test]
    fn the_lease_is_the_nodes_in_kube_node_lease_for_40_s() {
        let lease = new_lease("node-1", Some("uid-1"), DURATION_SECONDS, at(0));
        assert_eq!(lease.metadata.name.as_deref(), Some("node-1"));
        assert_eq!(lease.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "node-1", "uid-1"));
        let spec = lease.spec.unwrap();
        assert_eq!((spec.holder_identity.as_deref(), spec.lease_duration_seconds), (Some("node-1"), Some(40)));
        assert_eq!(spec.renew_time, Some(MicroTime(at(0))));
        assert_eq!(RENEW_INTERVAL.as_secs(), u64::try_from(DURATION_SECONDS / 4).unwrap());
    }

    #[test]
    fn a_renewal_keeps_the_version_it_read_and_adds_the_owner_once_known() {
        let mut read = new_lease("node-1", None, DURATION_SECONDS, at(0));
        read.metadata.resource_version = Some("42".into());
        let lease = renewed(&read, "node-1", Some("uid-1"), DURATION_SECONDS, at(10));
        assert_eq!(lease.metadata.resource_version.as_deref(), Some("42"), "optimistic concurrency");
        assert_eq!(lease.spec.as_ref().unwrap().renew_time, Some(MicroTime(at(10))));
        assert_eq!(lease.metadata.owner_references.unwrap()[0].uid, "uid-1");
    }

    #[test]
    fn failures_back_off_from_200_ms_to_7_s() {
        let waits: Vec<u128> = (0..8).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
