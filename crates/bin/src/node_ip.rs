//! The node's IP, as upstream's `NodeAddress` setter finds it: `--node-ip` when given; else the
//! node's name when it is an IP; else the first address the node's name resolves to that can be
//! a node IP (not loopback, link-local or multicast, and assigned to this host); else the source
//! address of the default route. Pods' `hostIP`, the downward API's `status.hostIP` and the
//! probes of host-network pods use it, standalone as in a cluster.

use std::net::{IpAddr, ToSocketAddrs as _, UdpSocket};

/// The node's IP, from `--node-ip` (`given`, its first address when there are two) or found as
/// upstream finds it; `None` when this host has no address to offer.
pub(crate) fn node_ip(given: &str, node_name: &str) -> Option<IpAddr> {
    choose(given, node_name, &resolve, &is_assigned_here, default_route_ip)
}

/// [`node_ip`] with the host's answers passed in.
fn choose(
    given: &str,
    node_name: &str,
    resolve: &dyn Fn(&str) -> Vec<IpAddr>,
    assigned_here: &dyn Fn(IpAddr) -> bool,
    default_route: impl FnOnce() -> Option<IpAddr>,
) -> Option<IpAddr> {
    if let Some(first) = given.split(',').map(str::trim).find(|ip| !ip.is_empty()) {
        return first.parse().ok();
    }
    if let Ok(ip) = node_name.parse::<IpAddr>() {
        return Some(ip);
    }
    let can_be_node_ip = |ip: &IpAddr| !is_loopback_link_local_or_multicast(*ip) && assigned_here(*ip);
    resolve(node_name).into_iter().find(can_be_node_ip).or_else(default_route)
}

/// Upstream's `validateNodeIP`, but for the check against the host's interfaces.
fn is_loopback_link_local_or_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_multicast() || v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unicast_link_local() || v6.is_multicast() || v6.is_unspecified(),
    }
}

/// The addresses `name` resolves to (the system resolver: `/etc/hosts`, then DNS).
fn resolve(name: &str) -> Vec<IpAddr> {
    (name, 0).to_socket_addrs().map(|addrs| addrs.map(|a| a.ip()).collect()).unwrap_or_default()
}

/// Whether `ip` is one of this host's addresses: only those can be bound.
fn is_assigned_here(ip: IpAddr) -> bool {
    UdpSocket::bind((ip, 0)).is_ok()
}

/// The address this host reaches the world from: a UDP socket "connected" to a public address
/// sends nothing but picks the route's source address.
pub(crate) fn default_route_ip() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:80").ok()?;
    Some(socket.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_flag_then_the_name_then_dns_then_the_default_route() {
        let here = |candidate: IpAddr| candidate == ip("10.0.0.5") || candidate == ip("127.0.1.1");
        let dns = |_: &str| vec![ip("127.0.1.1"), ip("169.254.1.1"), ip("10.9.9.9"), ip("10.0.0.5")];
        let route = || Some(ip("10.0.0.7"));
        assert_eq!(choose("192.0.2.9,fd00::9", "n", &dns, &here, route), Some(ip("192.0.2.9")));
        assert_eq!(choose("", "192.0.2.10", &dns, &here, route), Some(ip("192.0.2.10")));
        // Loopback and link-local are skipped, and 10.9.9.9 is not this host's.
        assert_eq!(choose("", "n", &dns, &here, route), Some(ip("10.0.0.5")));
        // A name that resolves to loopback alone (Debian's 127.0.1.1): the default route.
        assert_eq!(choose("", "n", &|_| vec![ip("127.0.1.1")], &here, route), Some(ip("10.0.0.7")));
    }

    #[test]
    fn a_host_with_a_default_route_has_a_node_ip_of_its_own() {
        if default_route_ip().is_none() {
            return;
        }
        let found = node_ip("", "localhost").expect("an address");
        assert!(!is_loopback_link_local_or_multicast(found), "{found}");
        assert!(is_assigned_here(found));
    }
}
