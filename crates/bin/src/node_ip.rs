//! The node's IP, as upstream's `NodeAddress` setter finds it: `--node-ip` when given; else the
//! node's name when it is an IP; else the first address the node's name resolves to that can be
//! a node IP (not loopback, link-local or multicast, and assigned to this host), of the family
//! `--node-ip` prefers (`::` prefers IPv6); else the source address of the default route. Pods'
//! `hostIP`, the downward API's `status.hostIP` and the probes of host-network pods use it,
//! standalone as in a cluster.
//!
//! `--node-ip` may also be a dual-stack pair (upstream's `ParseNodeIPArgument` without a cloud
//! provider): its second address is the node's secondary IP, which the Node reports as a second
//! `InternalIP` and pods as their second `hostIPs` entry.

use std::net::{IpAddr, ToSocketAddrs as _, UdpSocket};

/// The addresses `--node-ip` gives (upstream `ParseNodeIPArgument`): none, one, or a dual-stack
/// pair, neither of which is unspecified; otherwise upstream's reason.
pub(crate) fn parse_node_ips(given: &str) -> Result<Vec<IpAddr>, String> {
    if given.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut ips = Vec::new();
    for text in given.split(',').map(str::trim).filter(|text| !text.is_empty()) {
        ips.push(text.parse::<IpAddr>().map_err(|_| format!("could not parse {text:?}"))?);
    }
    match ips.as_slice() {
        [_] => Ok(ips),
        [first, second] if first.is_ipv6() != second.is_ipv6() => {
            if first.is_unspecified() || second.is_unspecified() {
                return Err("dual-stack node IP cannot include '0.0.0.0' or '::'".to_owned());
            }
            Ok(ips)
        }
        _ => Err("must contain either a single IP or a dual-stack pair of IPs".to_owned()),
    }
}

/// The node's IP, from `--node-ip` (`given`, already [`parse_node_ips`]d: its first address
/// unless unspecified) or found as upstream finds it; `None` when this host has no address to
/// offer.
pub(crate) fn node_ip(given: &[IpAddr], node_name: &str) -> Option<IpAddr> {
    choose(given.first().copied(), node_name, &resolve, &is_assigned_here, default_route_ip)
}

/// [`node_ip`] with the host's answers passed in.
fn choose(
    given: Option<IpAddr>,
    node_name: &str,
    resolve: &dyn Fn(&str) -> Vec<IpAddr>,
    assigned_here: &dyn Fn(IpAddr) -> bool,
    default_route: impl FnOnce() -> Option<IpAddr>,
) -> Option<IpAddr> {
    if let Some(given) = given.filter(|ip| !ip.is_unspecified()) {
        return Some(given);
    }
    if let Ok(ip) = node_name.parse::<IpAddr>() {
        return Some(ip);
    }
    // IPv4 is preferred unless `--node-ip` is `::`; an address of the other family still does.
    let prefer_ipv6 = given.is_some_and(|ip| ip.is_ipv6());
    let can_be_node_ip = |ip: &IpAddr| !is_loopback_link_local_or_multicast(*ip) && assigned_here(*ip);
    let candidates: Vec<IpAddr> = resolve(node_name).into_iter().filter(can_be_node_ip).collect();
    let preferred = candidates.iter().find(|ip| ip.is_ipv6() == prefer_ipv6);
    preferred.or(candidates.first()).copied().or_else(default_route)
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
        assert_eq!(choose(Some(ip("192.0.2.9")), "n", &dns, &here, route), Some(ip("192.0.2.9")));
        assert_eq!(choose(None, "192.0.2.10", &dns, &here, route), Some(ip("192.0.2.10")));
        // Loopback and link-local are skipped, and 10.9.9.9 is not this host's.
        assert_eq!(choose(None, "n", &dns, &here, route), Some(ip("10.0.0.5")));
        assert_eq!(choose(Some(ip("0.0.0.0")), "n", &dns, &here, route), Some(ip("10.0.0.5")), "unspecified: found");
        // A name that resolves to loopback alone (Debian's 127.0.1.1): the default route.
        assert_eq!(choose(None, "n", &|_| vec![ip("127.0.1.1")], &here, route), Some(ip("10.0.0.7")));
    }

    #[test]
    fn unspecified_ipv6_prefers_the_names_ipv6_address() {
        let here = |_: IpAddr| true;
        let dns = |_: &str| vec![ip("10.0.0.5"), ip("fd00::5")];
        assert_eq!(choose(None, "n", &dns, &here, || None), Some(ip("10.0.0.5")));
        assert_eq!(choose(Some(ip("::")), "n", &dns, &here, || None), Some(ip("fd00::5")));
        let v4_only = |_: &str| vec![ip("10.0.0.5")];
        assert_eq!(choose(Some(ip("::")), "n", &v4_only, &here, || None), Some(ip("10.0.0.5")), "the other family");
    }

    #[test]
    fn node_ip_takes_one_address_or_a_dual_stack_pair_as_upstream() {
        assert_eq!(parse_node_ips(""), Ok(vec![]));
        assert_eq!(parse_node_ips("192.0.2.9"), Ok(vec![ip("192.0.2.9")]));
        assert_eq!(parse_node_ips("192.0.2.9,"), Ok(vec![ip("192.0.2.9")]), "an empty entry is skipped");
        assert_eq!(parse_node_ips("192.0.2.9, fd00::9"), Ok(vec![ip("192.0.2.9"), ip("fd00::9")]));
        assert_eq!(parse_node_ips("fd00::9,192.0.2.9"), Ok(vec![ip("fd00::9"), ip("192.0.2.9")]));
        let pair = "must contain either a single IP or a dual-stack pair of IPs";
        assert_eq!(parse_node_ips("192.0.2.9,192.0.2.10").unwrap_err(), pair);
        assert_eq!(parse_node_ips("192.0.2.9,fd00::9,192.0.2.10").unwrap_err(), pair);
        assert_eq!(
            parse_node_ips("0.0.0.0,fd00::9").unwrap_err(),
            "dual-stack node IP cannot include '0.0.0.0' or '::'"
        );
        assert_eq!(parse_node_ips("192.0.2.9,x").unwrap_err(), "could not parse \"x\"");
    }

    #[test]
    fn a_host_with_a_default_route_has_a_node_ip_of_its_own() {
        if default_route_ip().is_none() {
            return;
        }
        let found = node_ip(&[], "localhost").expect("an address");
        assert!(!is_loopback_link_local_or_multicast(found), "{found}");
        assert!(is_assigned_here(found));
    }
}
