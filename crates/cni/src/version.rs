//! CNI specification versions and what a plugin says it supports.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// A CNI specification version (`major.minor.patch`), ordered numerically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    major: u32,
    minor: u32,
    patch: u32,
}

impl Version {
    /// 0.1.0, the version an undeclared `cniVersion` means.
    pub const V0_1_0: Version = Version::new(0, 1, 0);
    /// 0.2.0, the last version with the legacy `ip4`/`ip6` result layout.
    pub const V0_2_0: Version = Version::new(0, 2, 0);
    /// 0.3.0, the first version with `interfaces` and `ips` in results.
    pub const V0_3_0: Version = Version::new(0, 3, 0);
    /// 0.3.1.
    pub const V0_3_1: Version = Version::new(0, 3, 1);
    /// 0.4.0, which added CHECK and `prevResult` on DEL.
    pub const V0_4_0: Version = Version::new(0, 4, 0);
    /// 1.0.0, which dropped `version` from result IPs.
    pub const V1_0_0: Version = Version::new(1, 0, 0);
    /// 1.1.0, which added STATUS and GC.
    pub const V1_1_0: Version = Version::new(1, 1, 0);

    /// The versions this library reads and writes, oldest first.
    pub const SUPPORTED: [Version; 7] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_3_1,
        Version::V0_4_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// The newest version this library implements.
    pub const CURRENT: Version = Version::V1_1_0;

    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version { major, minor, patch }
    }

    /// Parses a declared `cniVersion`; an empty string means 0.1.0, as the spec says.
    pub fn from_declared(declared: &str) -> Result<Self, ParseVersionError> {
        if declared.is_empty() { Ok(Version::V0_1_0) } else { declared.parse() }
    }

    /// Whether this library can convert results to and from this version.
    pub fn is_supported(self) -> bool {
        Version::SUPPORTED.contains(&self)
    }

    /// The result layout this version uses on the wire.
    pub(crate) fn layout(self) -> Layout {
        if self < Version::V0_3_0 {
            Layout::Legacy
        } else if self < Version::V1_0_0 {
            Layout::Ips040
        } else {
            Layout::Current
        }
    }

    /// The supported versions as a list for error details, like the plugins print them.
    pub(crate) fn supported_list() -> String {
        let quoted: Vec<String> = Version::SUPPORTED.iter().map(|v| format!("\"{v}\"")).collect();
        format!("[{}]", quoted.join(" "))
    }
}

/// The three result layouts the spec versions share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// 0.1.0 and 0.2.0: `ip4` and `ip6` objects.
    Legacy,
    /// 0.3.0 to 0.4.0: `interfaces`, `ips` with a `version` field.
    Ips040,
    /// 1.0.0 and 1.1.0.
    Current,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A `cniVersion` that is not `major.minor.patch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {0:?}: expected major.minor.patch")]
pub struct ParseVersionError(pub String);

impl FromStr for Version {
    type Err = ParseVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseVersionError(s.to_owned());
        let mut parts = s.split('.');
        let mut next = || -> Result<u32, ParseVersionError> {
            let part = parts.next().ok_or_else(bad)?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse().map_err(|_| bad())
        };
        let version = Version::new(next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(version)
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Version::from_declared(&raw).map_err(serde::de::Error::custom)
    }
}

/// What a plugin answered to VERSION: the versions it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct VersionInfo {
    /// The version the answer itself is written in.
    #[serde(default)]
    pub cni_version: String,
    /// Every spec version the plugin accepts, as it spelled them.
    #[serde(default)]
    pub supported_versions: Vec<String>,
}

impl VersionInfo {
    /// The answer of a plugin too old to know VERSION: 0.1.0 only.
    pub fn legacy() -> Self {
        VersionInfo { cni_version: String::new(), supported_versions: vec![Version::V0_1_0.to_string()] }
    }

    /// Whether the plugin accepts `version`.
    pub fn supports(&self, version: Version) -> bool {
        self.supported_versions.iter().any(|v| Version::from_declared(v).is_ok_and(|v| v == version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        let versions: Vec<Version> =
            ["1.1.0", "0.3.1", "0.1.0", "10.0.0", "0.4.0"].iter().map(|s| s.parse().unwrap()).collect();
        let mut sorted = versions.clone();
        sorted.sort();
        let shown: Vec<String> = sorted.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["0.1.0", "0.3.1", "0.4.0", "1.1.0", "10.0.0"]);
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "1", "1.0", "1.0.0.0", "v1.0.0", "1.x.0", "1..0", "-1.0.0", "1.0.0-rc1"] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(Version::from_declared("").unwrap(), Version::V0_1_0);
    }

    #[test]
    fn layouts() {
        assert_eq!(Version::V0_2_0.layout(), Layout::Legacy);
        assert_eq!(Version::V0_3_0.layout(), Layout::Ips040);
        assert_eq!(Version::V0_4_0.layout(), Layout::Ips040);
        assert_eq!(Version::V1_0_0.layout(), Layout::Current);
        assert_eq!(Version::V1_1_0.layout(), Layout::Current);
    }

    #[test]
    fn version_info_of_the_debian_plugins() {
        let info: VersionInfo = serde_json::from_str(
            r#"{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}"#,
        )
        .unwrap();
        assert!(info.supports(Version::V1_0_0));
        assert!(info.supports(Version::V0_3_1));
        assert!(!info.supports(Version::V1_1_0));
        assert!(VersionInfo::legacy().supports(Version::V0_1_0));
    }
}
