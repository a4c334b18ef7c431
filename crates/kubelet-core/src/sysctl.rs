//! Which sysctls a pod may set (upstream `pkg/kubelet/sysctl` and
//! `component-helpers/node/util/sysctl`): the safe ones, and the unsafe ones the node allows
//! (`allowedUnsafeSysctls`), each only in a namespace the pod does not share with the host.

/// The kernel namespace a sysctl belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// `net.*`: the network namespace.
    Net,
    /// `kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`: the IPC namespace.
    Ipc,
}

impl Namespace {
    /// Upstream's name of the namespace, as its messages say it.
    pub fn name(self) -> &'static str {
        match self {
            Namespace::Net => "net",
            Namespace::Ipc => "ipc",
        }
    }
}

/// The sysctls any pod may set (upstream `SafeSysctlAllowlist`).
pub const SAFE: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// `name` in its dotted form (upstream `NormalizeName`): when its first separator is `/`, every
/// `/` and `.` swap (`net/ipv4/conf/eno2.100/rp_filter` is `net.ipv4.conf.eno2/100.rp_filter`).
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(first) if name[first..].starts_with('/') => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                other => other,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// The namespace of sysctl `name`, or of a pattern `prefix*` when every sysctl it covers is in
/// that namespace; `None` for a sysctl that is not namespaced (it would change the host).
pub fn namespace_of(name: &str) -> Option<Namespace> {
    let name = name.strip_suffix('*').unwrap_or(name);
    if name.starts_with("net.") {
        return Some(Namespace::Net);
    }
    let ipc = ["kernel.shm", "kernel.msg", "fs.mqueue."];
    if ipc.iter().any(|prefix| name.starts_with(prefix)) || name == "kernel.sem" {
        return Some(Namespace::Ipc);
    }
    None
}

/// Whether a pod with `host_network` and `host_ipc` may set sysctl `name`, beside the safe
/// ones allowed by `allowed_unsafe` (names, or prefixes ending in `*`); the error is upstream's
/// (`"vm.swappiness" not allowlisted`, `... not allowed with host net enabled`).
pub fn check(name: &str, host_network: bool, host_ipc: bool, allowed_unsafe: &[String]) -> Result<(), String> {
    let name = normalize(name);
    let allowed = SAFE.contains(&name.as_str())
        || allowed_unsafe.iter().any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => *pattern == name,
        });
    if !allowed {
        return Err(format!("{name:?} not allowlisted"));
    }
    match namespace_of(&name) {
        Some(namespace @ Namespace::Net) if host_network => {
            Err(format!("{name:?} not allowed with host {} enabled", namespace.name()))
        }
        Some(namespace @ Namespace::Ipc) if host_ipc => {
            Err(format!("{name:?} not allowed with host {} enabled", namespace.name()))
        }
        _ => Ok(()),
    }
}

/// Checks `allowedUnsafeSysctls` as upstream's kubelet does at start-up: each entry a
/// namespaced sysctl or a pattern (`net.*`) within one namespace.
pub fn check_allowed_unsafe(allowed_unsafe: &[String]) -> Result<(), String> {
    for entry in allowed_unsafe {
        if namespace_of(entry).is_none() {
            return Err(format!("the sysctl {entry:?} are not known to be namespaced"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_and_allowed_sysctls_pass_in_their_namespaces() {
        assert_eq!(check("net.ipv4.tcp_syncookies", false, false, &[]), Ok(()));
        assert_eq!(check("net/ipv4/tcp_syncookies", false, false, &[]), Ok(()), "slashes are dots");
        assert_eq!(check("kernel.msgmax", false, false, &[]), Err("\"kernel.msgmax\" not allowlisted".into()));
        let allowed = ["kernel.msg*".to_owned(), "net.core.somaxconn".to_owned()];
        assert_eq!(check("kernel.msgmax", false, false, &allowed), Ok(()));
        assert_eq!(check("net.core.somaxconn", false, false, &allowed), Ok(()));
        assert_eq!(
            check("net.core.somaxconn", true, false, &allowed),
            Err("\"net.core.somaxconn\" not allowed with host net enabled".into())
        );
        assert_eq!(
            check("kernel.msgmax", false, true, &allowed),
            Err("\"kernel.msgmax\" not allowed with host ipc enabled".into())
        );
        assert_eq!(check("kernel.shm_rmid_forced", true, false, &[]), Ok(()), "an IPC sysctl with the host network");
        assert_eq!(normalize("net/ipv4/conf/eno2.100/rp_filter"), "net.ipv4.conf.eno2/100.rp_filter");
        assert_eq!(normalize("net.ipv4.conf.eno2/100.rp_filter"), "net.ipv4.conf.eno2/100.rp_filter");
    }

    #[test]
    fn only_namespaced_sysctls_may_be_allowed() {
        assert_eq!(check_allowed_unsafe(&["net.*".into(), "kernel.sem".into(), "fs.mqueue.msg_max".into()]), Ok(()));
        assert!(check_allowed_unsafe(&["vm.swappiness".into()]).is_err());
        assert!(check_allowed_unsafe(&["kernel.*".into()]).is_err(), "kernel.* covers host sysctls too");
    }
}
