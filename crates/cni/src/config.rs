//! Network configuration: `.conflist` lists and single `.conf`/`.json` configurations.
//!
//! [`load_dir`] reads a directory the way runtimes do: `.conf`, `.conflist` and `.json` files in
//! lexical order, invalid ones set aside with an error naming the file and field, the first valid
//! one the default. Single configurations become one-element lists.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{ConfigError, Error, result::Dns, version::Version};

/// One plugin's configuration: a single `.conf` file, or one entry of a list's `plugins`.
///
/// Keys this library does not know (the plugin's own settings) are kept in `extra` and sent to
/// the plugin unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PluginConf {
    /// The version declared in this object; a list's version replaces it when the plugin runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_version: Option<String>,
    /// The network name; a list's name replaces it when the plugin runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The plugin binary's name.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Capabilities the plugin takes from the runtime (`portMappings`, `bandwidth`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capabilities: BTreeMap<String, bool>,
    /// The IPAM plugin and its settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Ipam>,
    /// DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// Every other key, kept as it was.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl PluginConf {
    /// A configuration for the plugin `plugin_type` and nothing else.
    pub fn new(plugin_type: impl Into<String>) -> Self {
        PluginConf {
            cni_version: None,
            name: None,
            plugin_type: plugin_type.into(),
            capabilities: BTreeMap::new(),
            ipam: None,
            dns: None,
            extra: Map::new(),
        }
    }

    /// The capabilities set to `true`.
    pub fn enabled_capabilities(&self) -> impl Iterator<Item = &str> {
        self.capabilities.iter().filter(|(_, on)| **on).map(|(name, _)| name.as_str())
    }
}

/// The IPAM section of a plugin configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Ipam {
    /// The IPAM plugin's binary name.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Its settings, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A network: a named, ordered list of plugins with one spec version.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NetworkList {
    /// The network name.
    pub name: String,
    /// The version every plugin is run with: the highest of `cniVersion` and `cniVersions`
    /// that this library implements.
    pub cni_version: Version,
    /// The version as written, for messages.
    pub declared_version: String,
    /// Never run CHECK for this network.
    pub disable_check: bool,
    /// Never run GC for this network.
    pub disable_gc: bool,
    /// The plugins, in ADD order.
    pub plugins: Vec<PluginConf>,
    /// Other top-level keys, kept.
    pub extra: Map<String, Value>,
    /// The bytes it was read from (stored in the result cache, as libcni does).
    pub bytes: Arc<[u8]>,
    /// The file it was read from.
    pub source: Option<PathBuf>,
}

impl NetworkList {
    /// Reads a `.conflist` document.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ConfigError> {
        let object = parse_object(bytes)?;
        NetworkList::from_object(object, bytes)
    }

    /// Reads a single plugin configuration (`.conf`, `.json`) as a one-element list.
    pub fn from_single_slice(bytes: &[u8]) -> Result<Self, ConfigError> {
        let object = parse_object(bytes)?;
        let name = required_string(&object, "name")?;
        let mut list = Map::new();
        list.insert("name".into(), Value::String(name));
        if let Some(version) = object.get("cniVersion") {
            list.insert("cniVersion".into(), version.clone());
        }
        list.insert("plugins".into(), Value::Array(vec![Value::Object(object)]));
        let rebuilt = serde_json::to_vec(&list).map_err(|e| ConfigError::syntax(e.to_string()))?;
        NetworkList::from_object(list, &rebuilt).map_err(|e| match e.field {
            // Errors name the fields of the file as written, not of the list built from it.
            Some(field) => ConfigError::field(field.trim_start_matches("plugins[0]."), e.message),
            None => e,
        })
    }

    /// A list of one plugin, named `name`, in `version`.
    pub fn single(name: impl Into<String>, version: Version, plugin: PluginConf) -> Result<Self, ConfigError> {
        let mut list = Map::new();
        list.insert("cniVersion".into(), Value::String(version.to_string()));
        list.insert("name".into(), Value::String(name.into()));
        let plugin = serde_json::to_value(&plugin).map_err(|e| ConfigError::syntax(e.to_string()))?;
        list.insert("plugins".into(), Value::Array(vec![plugin]));
        let bytes = serde_json::to_vec(&list).map_err(|e| ConfigError::syntax(e.to_string()))?;
        NetworkList::from_slice(&bytes)
    }

    /// Reads a file: `.conflist` as a list, anything else as a single configuration.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let bytes = std::fs::read(path).map_err(|e| ConfigError {
            path: Some(path.to_owned()),
            field: None,
            message: e.to_string(),
        })?;
        let parsed = if path.extension().is_some_and(|e| e == "conflist") {
            NetworkList::from_slice(&bytes)
        } else {
            NetworkList::from_single_slice(&bytes)
        };
        let mut list = parsed.map_err(|e| e.in_file(Some(path)))?;
        list.source = Some(path.to_owned());
        Ok(list)
    }

    fn from_object(mut object: Map<String, Value>, bytes: &[u8]) -> Result<Self, ConfigError> {
        let name = required_string(&object, "name")?;
        validate_name(&name).map_err(|reason| ConfigError::field("name", reason))?;
        let declared_version = match object.get("cniVersion") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(ConfigError::field("cniVersion", format!("must be a string, not {other}"))),
        };
        let mut version =
            Version::from_declared(&declared_version).map_err(|e| ConfigError::field("cniVersion", e.to_string()))?;
        if let Some(versions) = object.get("cniVersions") {
            let Value::Array(versions) = versions else {
                return Err(ConfigError::field("cniVersions", "must be a list of versions"));
            };
            // As libcni: the highest listed version this implementation knows wins.
            let mut best: Option<Version> = (version <= Version::CURRENT).then_some(version);
            for (i, v) in versions.iter().enumerate() {
                let field = format!("cniVersions[{i}]");
                let text = v.as_str().ok_or_else(|| ConfigError::field(&field, "must be a string"))?;
                let parsed: Version =
                    text.parse().map_err(|e: crate::ParseVersionError| ConfigError::field(&field, e.to_string()))?;
                if parsed <= Version::CURRENT {
                    best = best.max(Some(parsed));
                }
            }
            if let Some(best) = best {
                version = best;
            }
        }
        let disable_check = read_bool(&object, "disableCheck")?;
        let disable_gc = read_bool(&object, "disableGC")?;
        let plugins = match object.remove("plugins") {
            None => return Err(ConfigError::field("plugins", "missing: a network needs at least one plugin")),
            Some(Value::Array(plugins)) if plugins.is_empty() => {
                return Err(ConfigError::field("plugins", "empty: a network needs at least one plugin"));
            }
            Some(Value::Array(plugins)) => plugins,
            Some(other) => return Err(ConfigError::field("plugins", format!("must be a list, not {other}"))),
        };
        let plugins = plugins
            .into_iter()
            .enumerate()
            .map(|(i, plugin)| parse_plugin(plugin).map_err(|e| prefix(e, &format!("plugins[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        for key in ["name", "cniVersion", "cniVersions", "disableCheck", "disableGC"] {
            object.remove(key);
        }
        Ok(NetworkList {
            name,
            cni_version: version,
            declared_version,
            disable_check,
            disable_gc,
            plugins,
            extra: object,
            bytes: Arc::from(bytes),
            source: None,
        })
    }
}

/// What [`load_dir`] found.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ConfDir {
    /// The directory read.
    pub dir: PathBuf,
    /// The valid networks, in file name order.
    pub networks: Vec<NetworkList>,
    /// The files set aside, with what is wrong in each.
    pub invalid: Vec<ConfigError>,
}

impl ConfDir {
    /// The default network: the first valid file.
    pub fn default_network(&self) -> Result<&NetworkList, Error> {
        self.networks.first().ok_or_else(|| Error::NoNetworks { dir: self.dir.clone(), invalid: self.invalid.clone() })
    }

    /// The network named `name`; lists (`.conflist`) win over single configurations, as in libcni.
    pub fn network(&self, name: &str) -> Result<&NetworkList, Error> {
        let is_list =
            |n: &&NetworkList| n.source.as_ref().is_some_and(|p| p.extension().is_some_and(|e| e == "conflist"));
        let named = || self.networks.iter().filter(|n| n.name == name);
        named().find(is_list).or_else(|| named().next()).ok_or_else(|| Error::NetworkNotFound {
            name: name.to_owned(),
            dir: self.dir.clone(),
            invalid: self.invalid.clone(),
        })
    }
}

/// The file extensions read from a configuration directory.
pub const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// Reads every `.conf`, `.conflist` and `.json` file of `dir` in lexical order.
///
/// A missing directory is empty, not an error; an unreadable one is an error.
pub fn load_dir(dir: &Path) -> Result<ConfDir, Error> {
    let mut found = ConfDir { dir: dir.to_owned(), ..ConfDir::default() };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(ConfigError { path: Some(dir.to_owned()), field: None, message: e.to_string() }.into()),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e)))
        .collect();
    files.sort();
    for file in files {
        match NetworkList::from_file(&file) {
            Ok(list) => found.networks.push(list),
            Err(e) => found.invalid.push(e),
        }
    }
    Ok(found)
}

/// The spec's rule for network names and container IDs: an alphanumeric, then alphanumerics,
/// `_`, `.` and `-`.
pub(crate) fn validate_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    match chars.next() {
        None => Err("must not be empty"),
        Some(c) if !c.is_ascii_alphanumeric() => Err("must start with a letter or digit"),
        _ if !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) => {
            Err("may only contain letters, digits, '_', '.' and '-'")
        }
        _ => Ok(()),
    }
}

fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ConfigError::syntax("the configuration must be a JSON object")),
        Err(e) => Err(ConfigError::syntax(format!("invalid JSON: {e}"))),
    }
}

fn required_string(object: &Map<String, Value>, key: &str) -> Result<String, ConfigError> {
    match object.get(key) {
        None => Err(ConfigError::field(key, "missing")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ConfigError::field(key, format!("must be a string, not {other}"))),
    }
}

/// A boolean, or the strings "true"/"false" in any case, as libcni accepts.
fn read_bool(object: &Map<String, Value>, key: &str) -> Result<bool, ConfigError> {
    match object.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(ConfigError::field(key, format!("must be true or false, not {other}"))),
    }
}

fn parse_plugin(value: Value) -> Result<PluginConf, ConfigError> {
    let Value::Object(object) = value else {
        return Err(ConfigError::syntax("a plugin configuration must be a JSON object"));
    };
    let plugin_type = required_string(&object, "type")?;
    validate_plugin_type(&plugin_type).map_err(|reason| ConfigError::field("type", reason))?;
    if let Some(capabilities) = object.get("capabilities") {
        let Value::Object(capabilities) = capabilities else {
            return Err(ConfigError::field("capabilities", "must be an object of booleans"));
        };
        if let Some((name, _)) = capabilities.iter().find(|(_, v)| !v.is_boolean()) {
            return Err(ConfigError::field(format!("capabilities.{name}"), "must be true or false"));
        }
    }
    if let Some(ipam) = object.get("ipam") {
        let Value::Object(ipam) = ipam else { return Err(ConfigError::field("ipam", "must be an object")) };
        let ipam_type = required_string(ipam, "type").map_err(|e| prefix(e, "ipam"))?;
        validate_plugin_type(&ipam_type).map_err(|reason| ConfigError::field("ipam.type", reason))?;
    }
    for key in ["name", "cniVersion"] {
        if let Some(v) = object.get(key).filter(|v| !v.is_string()) {
            return Err(ConfigError::field(key, format!("must be a string, not {v}")));
        }
    }
    serde_json::from_value(Value::Object(object)).map_err(|e| ConfigError::syntax(e.to_string()))
}

/// A plugin type names a binary: no path separators, not `.` or `..`.
fn validate_plugin_type(plugin_type: &str) -> Result<(), &'static str> {
    if plugin_type.is_empty() {
        Err("must not be empty")
    } else if plugin_type.contains(['/', '\\']) || plugin_type == "." || plugin_type == ".." {
        Err("must be a plugin binary name, not a path")
    } else {
        Ok(())
    }
}

fn prefix(mut error: ConfigError, prefix: &str) -> ConfigError {
    error.field = Some(match error.field {
        Some(field) => format!("{prefix}.{field}"),
        None => prefix.to_owned(),
    });
    error
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn list(value: Value) -> Result<NetworkList, ConfigError> {
        NetworkList::from_slice(&serde_json::to_vec(&value).unwrap())
    }

    fn field_of(value: Value) -> (Option<String>, String) {
        let e = list(value).unwrap_err();
        (e.field, e.message)
    }

    #[test]
    fn a_conflist_reads_with_plugin_keys_kept() {
        let net = list(json!({"cniVersion":"1.0.0","name":"pods","plugins":[
            {"type":"bridge","bridge":"cni0","isGateway":true,"ipam":{"type":"host-local","subnet":"10.1.0.0/16"}},
            {"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}))
        .unwrap();
        assert_eq!(net.name, "pods");
        assert_eq!(net.cni_version, Version::V1_0_0);
        assert_eq!(net.plugins.len(), 2);
        assert_eq!(net.plugins[0].extra["bridge"], "cni0");
        assert_eq!(net.plugins[0].ipam.as_ref().unwrap().extra["subnet"], "10.1.0.0/16");
        assert_eq!(net.plugins[1].enabled_capabilities().collect::<Vec<_>>(), ["portMappings"]);
        let back = serde_json::to_value(&net.plugins[0]).unwrap();
        assert_eq!(
            back,
            json!({"type":"bridge","bridge":"cni0","isGateway":true,"ipam":{"type":"host-local","subnet":"10.1.0.0/16"}})
        );
    }

    #[test]
    fn validation_names_the_field() {
        let cases = [
            (json!({"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}), "name", "missing"),
            (json!({"cniVersion":"1.0.0","name":"-x","plugins":[{"type":"bridge"}]}), "name", "start"),
            (json!({"cniVersion":"1.0.0","name":"a b","plugins":[{"type":"bridge"}]}), "name", "only contain"),
            (json!({"cniVersion":"1.0.0","name":7,"plugins":[{"type":"bridge"}]}), "name", "string"),
            (json!({"cniVersion":"one","name":"n","plugins":[{"type":"bridge"}]}), "cniVersion", "major.minor.patch"),
            (json!({"cniVersion":1,"name":"n","plugins":[{"type":"bridge"}]}), "cniVersion", "string"),
            (json!({"cniVersion":"1.0.0","name":"n"}), "plugins", "missing"),
            (json!({"cniVersion":"1.0.0","name":"n","plugins":[]}), "plugins", "empty"),
            (json!({"cniVersion":"1.0.0","name":"n","plugins":{}}), "plugins", "list"),
            (
                json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"bridge":"x"}]}),
                "plugins[1].type",
                "missing",
            ),
            (json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../bin/sh"}]}), "plugins[0].type", "path"),
            (json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":""}]}), "plugins[0].type", "empty"),
            (
                json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"b","ipam":{}}]}),
                "plugins[0].ipam.type",
                "missing",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"b","ipam":{"type":"a/b"}}]}),
                "plugins[0].ipam.type",
                "path",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"b","capabilities":{"portMappings":"yes"}}]}),
                "plugins[0].capabilities.portMappings",
                "true or false",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","disableCheck":"maybe","plugins":[{"type":"b"}]}),
                "disableCheck",
                "true or false",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","cniVersions":["1.0"],"plugins":[{"type":"b"}]}),
                "cniVersions[0]",
                "major.minor.patch",
            ),
        ];
        for (doc, field, words) in cases {
            let (got_field, message) = field_of(doc.clone());
            assert_eq!(got_field.as_deref(), Some(field), "{doc}");
            assert!(message.contains(words), "{doc}: {message}");
        }
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let e = NetworkList::from_slice(b"{\n  \"name\": \"n\",\n  \"plugins\": [\n").unwrap_err();
        assert_eq!(e.field, None);
        assert!(e.message.contains("line 4"), "{}", e.message);
    }

    #[test]
    fn versions_resolve_like_libcni() {
        let net = list(
            json!({"cniVersion":"0.4.0","cniVersions":["0.3.1","1.0.0","9.0.0"],"name":"n","plugins":[{"type":"b"}]}),
        );
        assert_eq!(net.unwrap().cni_version, Version::V1_0_0);
        let net = list(json!({"name":"n","plugins":[{"type":"b"}]})).unwrap();
        assert_eq!(net.cni_version, Version::V0_1_0);
        // A version this library does not implement is kept, so the plugin can refuse it.
        let net = list(json!({"cniVersion":"9.9.9","name":"n","plugins":[{"type":"b"}]})).unwrap();
        assert_eq!(net.cni_version.to_string(), "9.9.9");
        let net = list(
            json!({"cniVersion":"1.0.0","name":"n","disableCheck":"TRUE","disableGC":true,"plugins":[{"type":"b"}]}),
        )
        .unwrap();
        assert!(net.disable_check && net.disable_gc);
    }

    #[test]
    fn a_single_conf_becomes_a_list() {
        let bytes = serde_json::to_vec(&json!({"cniVersion":"0.3.1","name":"lo-net","type":"loopback","x":1})).unwrap();
        let net = NetworkList::from_single_slice(&bytes).unwrap();
        assert_eq!(net.name, "lo-net");
        assert_eq!(net.cni_version, Version::V0_3_1);
        assert_eq!(net.plugins.len(), 1);
        assert_eq!(net.plugins[0].plugin_type, "loopback");
        assert_eq!(net.plugins[0].extra["x"], 1);
        let bad = serde_json::to_vec(&json!({"cniVersion":"0.3.1","name":"n"})).unwrap();
        assert_eq!(NetworkList::from_single_slice(&bad).unwrap_err().field.as_deref(), Some("type"));
    }

    #[test]
    fn a_directory_loads_in_lexical_order_and_sets_invalid_files_aside() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| std::fs::write(dir.path().join(name), body).unwrap();
        write("20-b.conflist", r#"{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"bridge"}]}"#);
        write("10-broken.conflist", r#"{"cniVersion":"1.0.0","name":"broken","plugins":[{"bridge":"x"}]}"#);
        write("30-a.conf", r#"{"cniVersion":"1.0.0","name":"a","type":"ptp"}"#);
        write("40-b.json", r#"{"cniVersion":"1.0.0","name":"b","type":"macvlan"}"#);
        write("50-b.conflist", r#"{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"ipvlan"}]}"#);
        write("README.md", "not a config");
        std::fs::create_dir(dir.path().join("sub.conf")).unwrap();

        let found = load_dir(dir.path()).unwrap();
        let names: Vec<&str> = found.networks.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["b", "a", "b", "b"]);
        assert_eq!(found.default_network().unwrap().plugins[0].plugin_type, "bridge");
        assert_eq!(found.invalid.len(), 1);
        let invalid = found.invalid[0].to_string();
        assert!(invalid.contains("10-broken.conflist") && invalid.contains("plugins[0].type"), "{invalid}");
        assert_eq!(found.network("a").unwrap().plugins[0].plugin_type, "ptp");
        assert_eq!(found.network("b").unwrap().plugins[0].plugin_type, "bridge");
        let missing = found.network("zzz").unwrap_err().to_string();
        assert!(missing.contains("zzz") && missing.contains("10-broken.conflist"), "{missing}");

        let empty = load_dir(&dir.path().join("nope")).unwrap();
        assert!(matches!(empty.default_network(), Err(Error::NoNetworks { .. })));
    }
}
