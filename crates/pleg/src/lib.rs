//! Pod lifecycle event generators (PLEG) for kubelet-rs.
//!
//! This crate will hold the relisting PLEG (upstream `pkg/kubelet/pleg/generic.go`) and the
//! evented PLEG over CRI `GetContainerEvents` (`evented.go`), implementing
//! `kubelet_core::Pleg` and writing `kubelet_core::Cache`.
//! It has no public items yet: the implementation is tracked as its own issue.
