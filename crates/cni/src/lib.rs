//! A CNI invoker for kubelet-rs and other node agents (libcni in Rust).
//!
//! This crate will load network configuration lists, execute CNI plugins (ADD, DEL, CHECK,
//! STATUS, GC) with version conversion and an on-disk result cache.
//! It has no public items yet: the implementation is tracked as its own issue.
