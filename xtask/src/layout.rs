//! Where the test runtime lives: its directories and its registry's address, shared by
//! `images.rs` (which builds into them) and `runtime.rs` (which runs there), so neither names
//! the other for them.

/// Persistent state: containerd root, registry storage, images, logs.
pub(crate) const STATE_DIR: &str = "/var/lib/kubelet-rs-dev";
/// Runtime state: sockets, PID files, runc state.
pub(crate) const RUN_DIR: &str = "/run/kubelet-rs-dev";
/// The local registry's address.
pub(crate) const REGISTRY: &str = "127.0.0.1:5000";
/// The local registry's port (the port of [`REGISTRY`]).
pub(crate) const REGISTRY_PORT: u16 = 5000;
