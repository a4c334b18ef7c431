//! The sysctl admit handler (upstream `pkg/kubelet/sysctl/allowlist.go`).

use k8s_openapi::api::core::v1::Pod;

/// Checks every sysctl of `pod`'s security context against the safe ones and `allowed_unsafe`.
pub(super) fn check(pod: &Pod, allowed_unsafe: &[String]) -> Result<(), String> {
    let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
    let (host_network, host_ipc) = (spec.host_network.unwrap_or(false), spec.host_ipc.unwrap_or(false));
    let sysctls = spec.security_context.as_ref().and_then(|s| s.sysctls.as_ref());
    for sysctl in sysctls.into_iter().flatten() {
        kubelet_core::sysctl::check(&sysctl.name, host_network, host_ipc, allowed_unsafe)?;
    }
    Ok(())
}
