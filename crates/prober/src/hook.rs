//! Lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`): one run of a `postStart` or
//! `preStop` handler, with the probe actions.
//!
//! The runtime calls [`Hooks`] after `StartContainer` and before `StopContainer`; what a failure
//! means (a kill, an event) is the runtime's business.
//! Unlike a probe, a hook has no timeout of its own: an exec runs until the command ends, and the
//! runtime bounds a `preStop` by the container's grace period.

use std::time::Duration;

use k8s_openapi::api::core::v1::LifecycleHandler;
use kubelet_core::hook::{BoxFuture, Exec, HookError, HookRunner, Target};

use crate::handlers::{self, HttpTarget, ProbeError};

/// Runs lifecycle handlers: implements `kubelet_core::HookRunner` for a runtime to call.
///
/// An exec passes when the command exits 0; an httpGet when any HTTP answer comes (redirects are
/// followed on the same host, and the status is not checked, as upstream's); a sleep when its
/// time is up. A tcpSocket handler cannot run (upstream keeps the field only for compatibility).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hooks {
    user_agent: String,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks { user_agent: "kube-lifecycle/1.36".to_owned() }
    }
}

impl Hooks {
    /// Sets the `User-Agent` of httpGet hooks (upstream: `kube-lifecycle/<major>.<minor>`).
    #[must_use]
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    async fn run_one(&self, exec: &dyn Exec, target: Target<'_>, handler: &LifecycleHandler) -> Result<(), HookError> {
        if let Some(action) = &handler.exec {
            let command = action.command.clone().unwrap_or_default();
            let failed = |error: String, output: &[u8]| {
                HookError(format!(
                    "Exec lifecycle hook ({command:?}) {} failed - error: {error}, message: {:?}",
                    target.describe(),
                    handlers::limited(output)
                ))
            };
            return match exec.exec(target.container_id, &command).await {
                Err(err) => Err(failed(err, b"")),
                Ok(result) if result.exit_code == 0 => Ok(()),
                Ok(result) => {
                    let mut output = result.stdout;
                    output.extend_from_slice(&result.stderr);
                    let error = format!("command '{}' exited with {}", command.join(" "), result.exit_code);
                    Err(failed(error, &output))
                }
            };
        }
        if let Some(action) = &handler.http_get {
            let path = action.path.clone().unwrap_or_default();
            let failed = |error: String| {
                HookError(format!("HTTP lifecycle hook ({path}) {} failed - error: {error}", target.describe()))
            };
            let pod_ip = target.pod_ip.unwrap_or_default();
            if action.host.as_deref().unwrap_or_default().is_empty() && pod_ip.is_empty() {
                return Err(failed("failed to find networking container: the pod has no IP".to_owned()));
            }
            let http_target = HttpTarget::of(action, target.container, pod_ip).map_err(|ProbeError(e)| failed(e))?;
            return handlers::http_answer(&http_target, &self.user_agent).await.map_err(|e| failed(e.to_string()));
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(u64::try_from(sleep.seconds).unwrap_or(0))).await;
            return Ok(());
        }
        Err(HookError(format!(
            "Cannot run handler {}: invalid handler: none of exec, httpGet and sleep",
            target.describe()
        )))
    }
}

impl HookRunner for Hooks {
    fn run<'a>(
        &'a self,
        exec: &'a dyn Exec,
        target: Target<'a>,
        handler: &'a LifecycleHandler,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(self.run_one(exec, target, handler))
    }
}

#[cfg(test)]
mod tests;
