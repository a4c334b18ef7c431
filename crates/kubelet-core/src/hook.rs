//! Lifecycle hooks (upstream `kubecontainer.HandlerRunner`): the vocabulary between a runtime,
//! which decides when a `postStart` or `preStop` handler runs and what its failure means, and a
//! [`HookRunner`], which runs one handler.
//!
//! The runner gets the runtime as an [`Exec`] for exec handlers, so neither holds the other.
//! A runtime without a runner runs no hooks, says so through `Runtime::runs_hooks`, and the
//! kubelet refuses pods that have them.

use std::{future::Future, pin::Pin, time::Duration};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::{ErrorChain, Runtime, runtime::ExecResult};

/// A boxed, sendable future, as the object-safe hook traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A hook that failed, with a message naming the handler, the container and the pod.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// The container a hook runs for.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Target<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The container's spec (for named ports).
    pub container: &'a Container,
    /// The container's runtime ID (for exec).
    pub container_id: &'a str,
    /// Where an httpGet handler without a host goes: the pod's IP (the node's for a host-network
    /// pod); `None` when the pod has none.
    pub pod_ip: Option<&'a str>,
}

impl<'a> Target<'a> {
    /// The target of a hook for `container` (runtime ID `container_id`) of `pod`.
    pub fn new(pod: &'a Pod, container: &'a Container, container_id: &'a str, pod_ip: Option<&'a str>) -> Self {
        Target { pod, container, container_id, pod_ip }
    }

    /// How upstream's messages name the container and pod: `for Container "c" in Pod "n_ns(uid)"`.
    pub fn describe(&self) -> String {
        format!(
            "for Container {:?} in Pod \"{}({})\"",
            self.container.name,
            crate::types::pod_full_name(self.pod),
            self.pod.metadata.uid.as_deref().unwrap_or_default()
        )
    }
}

/// Runs a command in a container and waits for it without a time limit: the part of a runtime an
/// exec hook needs. Every [`Runtime`] is one.
pub trait Exec: Send + Sync {
    /// Runs `command` in container `container_id`; an error is the runtime's, as one line.
    fn exec<'a>(&'a self, container_id: &'a str, command: &'a [String]) -> BoxFuture<'a, Result<ExecResult, String>>;
}

impl<R: Runtime> Exec for R {
    fn exec<'a>(&'a self, container_id: &'a str, command: &'a [String]) -> BoxFuture<'a, Result<ExecResult, String>> {
        // A zero timeout is none: a hook's command runs as long as it takes.
        Box::pin(async move {
            self.exec_sync(container_id, command, Duration::ZERO).await.map_err(|e| ErrorChain(&e).to_string())
        })
    }
}

/// Runs one lifecycle handler (exec, httpGet, sleep) for a container.
pub trait HookRunner: Send + Sync {
    /// Runs `handler` for `target`, exec handlers through `exec`; `Ok` when it passed.
    fn run<'a>(
        &'a self,
        exec: &'a dyn Exec,
        target: Target<'a>,
        handler: &'a LifecycleHandler,
    ) -> BoxFuture<'a, Result<(), HookError>>;
}
