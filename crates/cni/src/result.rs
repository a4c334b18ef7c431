//! The result of ADD, read from and written to every spec version's layout.
//!
//! [`AddResult`] holds the current (1.x) shape; [`AddResult::from_slice`] reads any layout and
//! [`AddResult::to_json`] writes the layout of the result's own `cni_version`:
//! legacy `ip4`/`ip6` objects for 0.1.0 and 0.2.0, `ips` with a `version` field for 0.3.x and
//! 0.4.0, and `ips` without it from 1.0.0 on. Keys this library does not know are kept.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    Error,
    version::{Layout, Version},
};

/// What ADD returns: interfaces, addresses, routes and DNS, in the current layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AddResult {
    /// The version the result is expressed in; [`AddResult::to_json`] writes its layout.
    pub cni_version: Version,
    /// Interfaces created, host side included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    /// Routes created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS settings for the container.
    #[serde(default)]
    pub dns: Dns,
    /// Keys of the result this library does not know, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One interface of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Interface {
    /// The interface name.
    pub name: String,
    /// Its hardware address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The network namespace it is in; `None` on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// A socket for it (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
    /// The PCI device (1.1.0).
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    /// Other keys, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One address of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IpConfig {
    /// The index of the interface in [`AddResult::interfaces`] it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// The address with its prefix length (`10.85.0.7/16`).
    pub address: IpNet,
    /// The gateway of its subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Other keys, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One route of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Route {
    /// The destination.
    pub dst: IpNet,
    /// The next hop; the interface's gateway when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// The route's MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// The priority (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// The routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// The scope (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
    /// Other keys, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Route {
    /// A route to `dst`, through `gw` when given.
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Self {
        Route { dst, gw, mtu: None, advmss: None, priority: None, table: None, scope: None, extra: Map::new() }
    }
}

/// DNS settings, in results and configurations alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Dns {
    /// Name servers, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// The 0.1.0/0.2.0 layout.
#[derive(Debug, Deserialize, Serialize)]
struct LegacyResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip4: Option<LegacyIp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip6: Option<LegacyIp>,
    #[serde(default)]
    dns: Dns,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize, Serialize)]
struct LegacyIp {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
}

/// Keys 1.1.0 added to interfaces and routes, which the 0.x layouts do not have.
const INTERFACE_KEYS_1_1: [&str; 3] = ["mtu", "socketPath", "pciID"];
const ROUTE_KEYS_1_1: [&str; 5] = ["mtu", "advmss", "priority", "table", "scope"];

impl AddResult {
    /// An empty result in `version`.
    pub fn new(version: Version) -> Self {
        AddResult {
            cni_version: version,
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
            dns: Dns::default(),
            extra: Map::new(),
        }
    }

    /// Reads a result in any supported version's layout (a plugin's stdout, a cached result).
    pub fn from_slice(bytes: &[u8]) -> Result<Self, Error> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| bad_result(e.to_string()))?;
        AddResult::from_value(value)
    }

    /// Reads a result from JSON already parsed.
    pub fn from_value(value: Value) -> Result<Self, Error> {
        let Value::Object(mut object) = value else {
            return Err(bad_result("a result must be a JSON object"));
        };
        let version = match object.remove("cniVersion") {
            None | Some(Value::Null) => Version::V0_1_0,
            Some(Value::String(s)) => Version::from_declared(&s).map_err(|e| bad_result(e.to_string()))?,
            Some(other) => return Err(bad_result(format!("cniVersion must be a string, not {other}"))),
        };
        if !version.is_supported() {
            return Err(Error::IncompatibleVersion {
                details: format!("result is \"{version}\", kubelet-cni supports {}", Version::supported_list()),
            });
        }
        // Some plugins (Debian's loopback 1.1.1) answer a 0.1.0/0.2.0 config in the newer
        // layout; read what they wrote rather than an empty legacy result.
        let newer_shape = !object.contains_key("ip4")
            && !object.contains_key("ip6")
            && (object.contains_key("ips") || object.contains_key("interfaces"));
        match version.layout() {
            Layout::Legacy if !newer_shape => {
                let legacy: LegacyResult =
                    serde_json::from_value(Value::Object(object)).map_err(|e| bad_result(e.to_string()))?;
                let mut result = AddResult::new(version);
                for ip in [legacy.ip4, legacy.ip6].into_iter().flatten() {
                    result.ips.push(IpConfig {
                        interface: None,
                        address: ip.ip,
                        gateway: ip.gateway,
                        extra: Map::new(),
                    });
                    result.routes.extend(ip.routes);
                }
                result.dns = legacy.dns;
                result.extra = legacy.extra;
                Ok(result)
            }
            Layout::Legacy | Layout::Ips040 | Layout::Current => {
                object.insert("cniVersion".into(), Value::String(version.to_string()));
                let mut result: AddResult =
                    serde_json::from_value(Value::Object(object)).map_err(|e| bad_result(e.to_string()))?;
                // `version` ("4"/"6") is derived from the address; it is not an unknown key.
                for ip in &mut result.ips {
                    ip.extra.remove("version");
                }
                Ok(result)
            }
        }
    }

    /// The same result expressed in `version`: checks that the layout can carry it.
    ///
    /// The legacy layout (0.1.0, 0.2.0) has room for one IPv4 and one IPv6 address and no
    /// interfaces; a result without any address cannot be written in it.
    pub fn to_version(&self, version: Version) -> Result<Self, Error> {
        if !version.is_supported() {
            return Err(Error::IncompatibleVersion {
                details: format!("cannot convert to \"{version}\": kubelet-cni supports {}", Version::supported_list()),
            });
        }
        if version.layout() == Layout::Legacy && self.ips.is_empty() {
            return Err(Error::IncompatibleVersion {
                details: format!("cannot convert a result without IP addresses to \"{version}\""),
            });
        }
        let mut converted = self.clone();
        converted.cni_version = version;
        if version.layout() == Layout::Legacy {
            // What the legacy layout cannot hold is dropped, as libcni does.
            converted.ips = legacy_ips(&self.ips).into_iter().flatten().cloned().collect();
            converted.interfaces.clear();
            for ip in &mut converted.ips {
                ip.interface = None;
            }
        }
        Ok(converted)
    }

    /// The result as JSON in the layout of its `cni_version`.
    pub fn to_json(&self) -> Result<Value, Error> {
        match self.cni_version.layout() {
            Layout::Current => serde_json::to_value(self).map_err(|e| bad_result(e.to_string())),
            Layout::Ips040 => {
                let mut value = serde_json::to_value(self).map_err(|e| bad_result(e.to_string()))?;
                if let Some(ips) = value.get_mut("ips").and_then(Value::as_array_mut) {
                    for (ip, typed) in ips.iter_mut().zip(&self.ips) {
                        let family = if typed.address.addr().is_ipv4() { "4" } else { "6" };
                        if let Some(ip) = ip.as_object_mut() {
                            ip.insert("version".into(), Value::String(family.into()));
                        }
                    }
                }
                strip(&mut value, "interfaces", &INTERFACE_KEYS_1_1);
                strip(&mut value, "routes", &ROUTE_KEYS_1_1);
                Ok(value)
            }
            Layout::Legacy => {
                let [v4, v6] = legacy_ips(&self.ips);
                if v4.is_none() && v6.is_none() {
                    return Err(Error::IncompatibleVersion {
                        details: format!("cannot write a result without IP addresses as \"{}\"", self.cni_version),
                    });
                }
                let routes_of = |v4_family: bool| -> Vec<Route> {
                    self.routes.iter().filter(|r| r.dst.addr().is_ipv4() == v4_family).cloned().collect()
                };
                let legacy = LegacyResult {
                    ip4: v4.map(|ip| LegacyIp { ip: ip.address, gateway: ip.gateway, routes: routes_of(true) }),
                    ip6: v6.map(|ip| LegacyIp { ip: ip.address, gateway: ip.gateway, routes: routes_of(false) }),
                    dns: self.dns.clone(),
                    extra: self.extra.clone(),
                };
                let mut value = serde_json::to_value(&legacy).map_err(|e| bad_result(e.to_string()))?;
                strip(&mut value, "routes", &ROUTE_KEYS_1_1);
                if let Some(object) = value.as_object_mut() {
                    object.insert("cniVersion".into(), Value::String(self.cni_version.to_string()));
                    for key in ["ip4", "ip6"] {
                        if let Some(ip) = object.get_mut(key) {
                            strip(ip, "routes", &ROUTE_KEYS_1_1);
                        }
                    }
                }
                Ok(value)
            }
        }
    }

    /// The result as bytes in the layout of its `cni_version`.
    pub fn to_vec_pretty(&self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec_pretty(&self.to_json()?).map_err(|e| bad_result(e.to_string()))
    }
}

/// The first IPv4 and the first IPv6 address, which is all the legacy layout holds.
fn legacy_ips(ips: &[IpConfig]) -> [Option<&IpConfig>; 2] {
    [ips.iter().find(|ip| ip.address.addr().is_ipv4()), ips.iter().find(|ip| ip.address.addr().is_ipv6())]
}

/// Removes `keys` from every object of the array `value[array]`.
fn strip(value: &mut Value, array: &str, keys: &[&str]) {
    if let Some(items) = value.get_mut(array).and_then(Value::as_array_mut) {
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            for key in keys {
                item.remove(*key);
            }
        }
    }
}

fn bad_result(reason: impl Into<String>) -> Error {
    Error::BadOutput {
        plugin: String::new(),
        command: crate::Command::Add,
        reason: reason.into(),
        stdout: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    /// What bridge + host-local print for 1.0.0 (runtime-recipe.md).
    fn bridge_1_0() -> Value {
        json!({"cniVersion":"1.0.0",
            "interfaces":[{"name":"crlabcni0","mac":"22:5c:00:00:00:01"},
                          {"name":"vethbc1a9a25","mac":"16:38:00:00:00:02"},
                          {"name":"eth0","mac":"72:28:00:00:00:03","sandbox":"/var/run/netns/crlab-cni-test"}],
            "ips":[{"interface":2,"address":"10.213.0.7/24","gateway":"10.213.0.1"}],
            "routes":[{"dst":"0.0.0.0/0"}],
            "dns":{}})
    }

    #[test]
    fn current_layout_round_trips_exactly() {
        let result = AddResult::from_value(bridge_1_0()).unwrap();
        assert_eq!(result.ips[0].interface, Some(2));
        assert_eq!(result.ips[0].address.to_string(), "10.213.0.7/24");
        assert_eq!(result.to_json().unwrap(), bridge_1_0());
    }

    #[test]
    fn ips_layout_adds_and_reads_the_version_field() {
        let result = AddResult::from_value(bridge_1_0()).unwrap().to_version(v("0.4.0")).unwrap();
        let json = result.to_json().unwrap();
        assert_eq!(json["cniVersion"], "0.4.0");
        assert_eq!(json["ips"][0]["version"], "4");
        // Back to 1.0.0: the version field is gone, not kept as an unknown key.
        let back = AddResult::from_value(json).unwrap().to_version(Version::V1_0_0).unwrap();
        assert_eq!(back.to_json().unwrap(), bridge_1_0());
    }

    #[test]
    fn ipv6_addresses_get_version_6() {
        let result = AddResult::from_value(json!({"cniVersion":"1.0.0",
            "ips":[{"address":"fd00::5/64","gateway":"fd00::1"}, {"address":"10.1.0.5/24"}]}))
        .unwrap()
        .to_version(Version::V0_3_1)
        .unwrap();
        let json = result.to_json().unwrap();
        assert_eq!(json["ips"][0]["version"], "6");
        assert_eq!(json["ips"][1]["version"], "4");
    }

    #[test]
    fn legacy_layout_both_ways() {
        let legacy = json!({"cniVersion":"0.2.0",
            "ip4":{"ip":"10.213.0.3/24","gateway":"10.213.0.1","routes":[{"dst":"0.0.0.0/0"}]},
            "dns":{}});
        let read = AddResult::from_value(legacy.clone()).unwrap();
        assert_eq!(read.ips.len(), 1);
        assert_eq!(read.routes.len(), 1);
        assert_eq!(read.to_json().unwrap(), legacy);

        let up = read.to_version(Version::V1_0_0).unwrap().to_json().unwrap();
        assert_eq!(
            up,
            json!({"cniVersion":"1.0.0","ips":[{"address":"10.213.0.3/24","gateway":"10.213.0.1"}],
                   "routes":[{"dst":"0.0.0.0/0"}],"dns":{}})
        );

        let down = AddResult::from_value(bridge_1_0()).unwrap().to_version(Version::V0_1_0).unwrap();
        assert_eq!(
            down.to_json().unwrap(),
            json!({"cniVersion":"0.1.0",
                   "ip4":{"ip":"10.213.0.7/24","gateway":"10.213.0.1","routes":[{"dst":"0.0.0.0/0"}]},
                   "dns":{}})
        );
    }

    #[test]
    fn a_legacy_version_in_the_newer_layout_is_read_as_written() {
        // Debian's loopback answers a 0.2.0 config like this.
        let result = AddResult::from_value(json!({"cniVersion":"0.2.0",
            "interfaces":[{"name":"lo","mac":"00:00:00:00:00:00","sandbox":"/var/run/netns/x"}],
            "ips":[{"interface":0,"address":"127.0.0.1/8"},{"interface":0,"address":"::1/128"}],"dns":{}}))
        .unwrap();
        assert_eq!(result.ips.len(), 2);
        let json = result.to_version(Version::V0_2_0).unwrap().to_json().unwrap();
        assert_eq!(json, json!({"cniVersion":"0.2.0","ip4":{"ip":"127.0.0.1/8"},"ip6":{"ip":"::1/128"},"dns":{}}));
    }

    #[test]
    fn legacy_splits_routes_by_family() {
        let result = AddResult::from_value(json!({"cniVersion":"1.0.0",
            "ips":[{"address":"10.1.0.5/24"},{"address":"fd00::5/64"},{"address":"10.2.0.5/24"}],
            "routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0","gw":"fd00::1"}]}))
        .unwrap();
        let json = result.to_version(Version::V0_2_0).unwrap().to_json().unwrap();
        assert_eq!(json["ip4"]["ip"], "10.1.0.5/24");
        assert_eq!(json["ip4"]["routes"], json!([{"dst":"0.0.0.0/0"}]));
        assert_eq!(json["ip6"]["routes"], json!([{"dst":"::/0","gw":"fd00::1"}]));
    }

    #[test]
    fn legacy_needs_an_address() {
        let loopless = AddResult::from_value(json!({"cniVersion":"1.0.0","interfaces":[{"name":"x"}]})).unwrap();
        assert!(matches!(loopless.to_version(Version::V0_2_0), Err(Error::IncompatibleVersion { .. })));
    }

    #[test]
    fn fields_of_1_1_are_dropped_below_1_0() {
        let result = AddResult::from_value(json!({"cniVersion":"1.1.0",
            "interfaces":[{"name":"eth0","mtu":1400,"socketPath":"/s","pciID":"0000:00:01.0"}],
            "ips":[{"interface":0,"address":"10.1.0.5/24"}],
            "routes":[{"dst":"0.0.0.0/0","mtu":1400,"table":100}]}))
        .unwrap();
        assert_eq!(result.interfaces[0].mtu, Some(1400));
        assert_eq!(result.to_json().unwrap()["interfaces"][0]["pciID"], "0000:00:01.0");
        let old = result.to_version(Version::V0_4_0).unwrap().to_json().unwrap();
        assert_eq!(old["interfaces"], json!([{"name":"eth0"}]));
        assert_eq!(old["routes"], json!([{"dst":"0.0.0.0/0"}]));
    }

    #[test]
    fn unknown_keys_are_kept() {
        let result = AddResult::from_value(json!({"cniVersion":"1.0.0","vendor":{"x":1},
            "interfaces":[{"name":"eth0","vendorKey":true}],
            "ips":[{"address":"10.1.0.5/24","label":"a"}]}))
        .unwrap();
        let json = result.to_json().unwrap();
        assert_eq!(json["vendor"], json!({"x":1}));
        assert_eq!(json["interfaces"][0]["vendorKey"], true);
        assert_eq!(json["ips"][0]["label"], "a");
    }

    #[test]
    fn loopback_result_reads() {
        let lo = json!({"cniVersion":"1.0.0","interfaces":[{"name":"lo","mac":"00:00:00:00:00:00","sandbox":"/var/run/netns/x"}],
            "ips":[{"interface":0,"address":"127.0.0.1/8"},{"interface":0,"address":"::1/128"}],"dns":{}});
        let result = AddResult::from_value(lo.clone()).unwrap();
        assert_eq!(result.ips.len(), 2);
        assert_eq!(result.to_json().unwrap(), lo);
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            &b"not json"[..],
            b"[1,2]",
            b"{\"cniVersion\":5}",
            b"{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"nope\"}]}",
        ] {
            assert!(
                matches!(AddResult::from_slice(bad), Err(Error::BadOutput { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(AddResult::from_slice(br#"{"cniVersion":"9.9.9"}"#), Err(Error::IncompatibleVersion { .. })));
    }
}
