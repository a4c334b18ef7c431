//! Per-pod serialized workers for kubelet-rs.
//!
//! This crate will hold the pod workers (upstream `pkg/kubelet/pod_workers.go`): one worker per
//! pod UID with the syncing, terminating, terminated state machine, implementing
//! `kubelet_core::PodWorkers` and calling back into `kubelet_core::PodSyncer`.
//! It has no public items yet: the implementation is tracked as its own issue.
