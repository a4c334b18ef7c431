//! [`Cni`]: ADD, DEL, CHECK, STATUS and GC of network lists, as libcni's `CNIConfig`.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tracing::{debug, warn};

use crate::{
    AddResult, Cache, CacheEntry, Command, Error, Exec, Invocation, NetworkList, Output, PluginConf, PluginError,
    RawExec, Version, VersionInfo, config::validate_name, error::excerpt,
};

/// How long a plugin may run before it is killed, unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The attachment a command is about: container, namespace, interface and runtime arguments.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct RuntimeConf {
    /// The container (sandbox) ID.
    pub container_id: String,
    /// The network namespace path.
    pub netns: String,
    /// The interface name inside the namespace.
    pub ifname: String,
    /// `CNI_ARGS` pairs.
    pub args: Vec<(String, String)>,
    /// Capability arguments (`portMappings`, `bandwidth`, `ips`, `mac`, `dns`, ...), injected
    /// into `runtimeConfig` only for plugins that declare the capability.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    /// An attachment of `container_id` in `netns` as `ifname`.
    pub fn new(container_id: impl Into<String>, netns: impl Into<String>, ifname: impl Into<String>) -> Self {
        RuntimeConf {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            args: Vec::new(),
            capability_args: Map::new(),
        }
    }

    /// Adds a `CNI_ARGS` pair.
    pub fn with_arg(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.args.push((key.into(), value.into()));
        self
    }

    /// Adds a capability argument.
    pub fn with_capability(mut self, name: impl Into<String>, value: Value) -> Self {
        self.capability_args.insert(name.into(), value);
        self
    }

    fn validate(&self) -> Result<(), Error> {
        validate_name(&self.container_id).map_err(|reason| Error::InvalidArgument {
            what: "container ID",
            value: self.container_id.clone(),
            reason,
        })?;
        validate_ifname(&self.ifname).map_err(|reason| Error::InvalidArgument {
            what: "interface name",
            value: self.ifname.clone(),
            reason,
        })
    }
}

/// Linux interface names: 1 to 15 bytes, no `/`, `:` or whitespace, not `.` or `..`.
fn validate_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("must not be empty")
    } else if name.len() > 15 {
        Err("must be at most 15 bytes")
    } else if name == "." || name == ".." {
        Err("must not be . or ..")
    } else if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        Err("must not contain '/', ':' or whitespace")
    } else {
        Ok(())
    }
}

/// An attachment that GC must keep.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GcAttachment {
    /// The container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
}

impl GcAttachment {
    /// An attachment.
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Self {
        GcAttachment { container_id: container_id.into(), ifname: ifname.into() }
    }
}

/// Runs CNI plugins for network lists: libcni in Rust.
///
/// Cheap to share behind an `Arc`; plugin VERSION answers are cached per binary (path and
/// modification time).
pub struct Cni {
    paths: Vec<PathBuf>,
    exec: Arc<dyn Exec>,
    cache: Cache,
    timeout: Duration,
    versions: Mutex<HashMap<PathBuf, (Option<SystemTime>, VersionInfo)>>,
}

impl std::fmt::Debug for Cni {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cni")
            .field("paths", &self.paths)
            .field("cache", &self.cache)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Cni {
    /// Plugins from `paths` (first match wins), run by [`RawExec`], results cached under
    /// `/var/lib/cni`, 60 s per plugin.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Cni {
            paths,
            exec: Arc::new(RawExec::default()),
            cache: Cache::default(),
            timeout: DEFAULT_TIMEOUT,
            versions: Mutex::new(HashMap::new()),
        }
    }

    /// Uses another executor.
    pub fn with_exec(mut self, exec: Arc<dyn Exec>) -> Self {
        self.exec = exec;
        self
    }

    /// Uses another cache directory.
    pub fn with_cache(mut self, cache: Cache) -> Self {
        self.cache = cache;
        self
    }

    /// Gives each plugin run at most `timeout`; its process group is killed after that.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The result cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Runs ADD for every plugin in order, each getting the previous result as `prevResult`,
    /// caches the final result and returns it in the list's version.
    pub async fn add_network_list(&self, list: &NetworkList, rt: &RuntimeConf) -> Result<AddResult, Error> {
        rt.validate()?;
        let version = list.cni_version;
        if !version.is_supported() {
            return Err(Error::IncompatibleVersion {
                details: format!("config is \"{version}\", kubelet-cni supports {}", Version::supported_list()),
            });
        }
        let mut previous: Option<AddResult> = None;
        for plugin in &list.plugins {
            let stdin = plugin_stdin(&list.name, version, plugin, previous.as_ref(), Some(rt))?;
            let output = self.run(&plugin.plugin_type, self.invocation(Command::Add, rt), &stdin).await?;
            let result = AddResult::from_slice(&output.stdout)
                .and_then(|r| r.to_version(version))
                .map_err(|e| bad_output(plugin, Command::Add, e, &output.stdout))?;
            previous = Some(result);
        }
        let result = previous.ok_or_else(|| Error::Config(crate::ConfigError::field("plugins", "empty")))?;
        let entry = Cache::entry(&list.name, &list.bytes, rt, result.to_json()?);
        self.cache.put(&entry).await?;
        Ok(result)
    }

    /// Runs DEL for every plugin in reverse order, with the cached result as `prevResult`
    /// (0.4.0+), in the version ADD used; then forgets the cached result.
    ///
    /// DEL of an attachment that does not exist succeeds, as the spec requires of plugins.
    pub async fn del_network_list(&self, list: &NetworkList, rt: &RuntimeConf) -> Result<(), Error> {
        rt.validate()?;
        let cached = match self.cache.get(&list.name, &rt.container_id, &rt.ifname).await {
            Ok(cached) => cached,
            Err(e) => {
                warn!(network = %list.name, container = %rt.container_id, error = %e, "unreadable cached result; DEL runs without it");
                None
            }
        };
        let version = add_version(list, cached.as_ref());
        let previous = previous_result(cached.as_ref(), version, Version::V0_4_0);
        for plugin in list.plugins.iter().rev() {
            let stdin = plugin_stdin(&list.name, version, plugin, previous.as_ref(), Some(rt))?;
            self.run(&plugin.plugin_type, self.invocation(Command::Del, rt), &stdin).await?;
        }
        self.cache.remove(&list.name, &rt.container_id, &rt.ifname).await
    }

    /// Runs CHECK for every plugin in order with the cached result as `prevResult` (0.4.0+).
    ///
    /// Does nothing when the list sets `disableCheck`.
    pub async fn check_network_list(&self, list: &NetworkList, rt: &RuntimeConf) -> Result<(), Error> {
        rt.validate()?;
        let cached = self.cache.get(&list.name, &rt.container_id, &rt.ifname).await?;
        let version = add_version(list, cached.as_ref());
        if version < Version::V0_4_0 {
            return Err(Error::NotSupported { version: version.to_string(), command: Command::Check });
        }
        if list.disable_check {
            debug!(network = %list.name, "CHECK disabled by the configuration");
            return Ok(());
        }
        let previous =
            previous_result(cached.as_ref(), version, Version::V0_4_0).ok_or_else(|| Error::NoCachedResult {
                network: list.name.clone(),
                container_id: rt.container_id.clone(),
                ifname: rt.ifname.clone(),
            })?;
        for plugin in &list.plugins {
            let stdin = plugin_stdin(&list.name, version, plugin, Some(&previous), Some(rt))?;
            self.run(&plugin.plugin_type, self.invocation(Command::Check, rt), &stdin).await?;
        }
        Ok(())
    }

    /// Asks every plugin whether it is ready (STATUS, 1.1.0+). Lists below 1.1.0, and plugins
    /// that do not support the list's version, are not asked.
    pub async fn status_network_list(&self, list: &NetworkList) -> Result<(), Error> {
        if list.cni_version < Version::V1_1_0 {
            debug!(network = %list.name, version = %list.cni_version, "STATUS needs 1.1.0; not asked");
            return Ok(());
        }
        for plugin in &list.plugins {
            if !self.plugin_supports(plugin, list.cni_version).await? {
                continue;
            }
            let stdin = plugin_stdin(&list.name, list.cni_version, plugin, None, None)?;
            self.run(&plugin.plugin_type, Invocation::new(Command::Status, self.paths.clone()), &stdin).await?;
        }
        Ok(())
    }

    /// Deletes every cached attachment of this network that `valid` does not name (all of
    /// them when `valid` is `None`), then sends GC (1.1.0+) to plugins that support it.
    ///
    /// Errors are collected: one stale attachment that fails to delete does not stop the rest.
    pub async fn gc_network_list(&self, list: &NetworkList, valid: Option<&[GcAttachment]>) -> Result<(), Error> {
        let keep: BTreeSet<(&str, &str)> =
            valid.unwrap_or_default().iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
        let mut errors = Vec::new();
        for entry in self.cache.attachments(None).await? {
            if entry.network_name != list.name || keep.contains(&(entry.container_id.as_str(), entry.if_name.as_str()))
            {
                continue;
            }
            if let Err(e) = self.del_network_list(list, &entry.runtime_conf()).await {
                errors.push(e);
            }
        }
        if list.cni_version >= Version::V1_1_0 && !list.disable_gc {
            let attachments = serde_json::to_value(valid.unwrap_or_default()).map_err(|e| json_error(&e))?;
            for plugin in &list.plugins {
                match self.plugin_supports(plugin, list.cni_version).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                }
                let mut stdin = plugin_object(&list.name, list.cni_version, plugin, None, None)?;
                stdin.insert("cni.dev/valid-attachments".into(), attachments.clone());
                let stdin = serde_json::to_vec(&stdin).map_err(|e| json_error(&e))?;
                if let Err(e) =
                    self.run(&plugin.plugin_type, Invocation::new(Command::Gc, self.paths.clone()), &stdin).await
                {
                    errors.push(e);
                }
            }
        }
        all_or_errors(errors)
    }

    /// ADD of a single plugin configuration (a one-element list).
    pub async fn add_network(
        &self,
        name: &str,
        version: Version,
        plugin: &PluginConf,
        rt: &RuntimeConf,
    ) -> Result<AddResult, Error> {
        self.add_network_list(&NetworkList::single(name, version, plugin.clone())?, rt).await
    }

    /// DEL of a single plugin configuration.
    pub async fn del_network(
        &self,
        name: &str,
        version: Version,
        plugin: &PluginConf,
        rt: &RuntimeConf,
    ) -> Result<(), Error> {
        self.del_network_list(&NetworkList::single(name, version, plugin.clone())?, rt).await
    }

    /// CHECK of a single plugin configuration.
    pub async fn check_network(
        &self,
        name: &str,
        version: Version,
        plugin: &PluginConf,
        rt: &RuntimeConf,
    ) -> Result<(), Error> {
        self.check_network_list(&NetworkList::single(name, version, plugin.clone())?, rt).await
    }

    /// The cached result of ADD for this attachment, in the list's version.
    pub async fn cached_result(&self, list: &NetworkList, rt: &RuntimeConf) -> Result<Option<AddResult>, Error> {
        let cached = self.cache.get(&list.name, &rt.container_id, &rt.ifname).await?;
        match cached.and_then(|c| c.result) {
            None => Ok(None),
            Some(result) => AddResult::from_value(result)?.to_version(list.cni_version).map(Some),
        }
    }

    /// Checks that every plugin of the list exists and supports its version; returns the
    /// capabilities the list's plugins take, sorted.
    pub async fn validate_network_list(&self, list: &NetworkList) -> Result<Vec<String>, Error> {
        let mut errors = Vec::new();
        let mut capabilities = BTreeSet::new();
        for plugin in &list.plugins {
            match self.plugin_supports(plugin, list.cni_version).await {
                Ok(true) => {}
                Ok(false) => errors.push(Error::IncompatibleVersion {
                    details: format!(
                        "plugin {} does not support config version \"{}\"",
                        plugin.plugin_type, list.cni_version
                    ),
                }),
                Err(e) => errors.push(e),
            }
            capabilities.extend(plugin.enabled_capabilities().map(str::to_owned));
        }
        all_or_errors(errors).map(|()| capabilities.into_iter().collect())
    }

    /// Asks a plugin which versions it supports (VERSION), cached per binary.
    ///
    /// A plugin too old to know VERSION supports 0.1.0 only.
    pub async fn version_info(&self, plugin_type: &str) -> Result<VersionInfo, Error> {
        let path = self.find(plugin_type)?;
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if let Some((_, info)) = self.lock_versions().get(&path).filter(|(when, _)| *when == modified) {
            return Ok(info.clone());
        }
        let stdin = serde_json::to_vec(&serde_json::json!({ "cniVersion": Version::CURRENT.to_string() }))
            .map_err(|e| json_error(&e))?;
        let info = match self.run(plugin_type, Invocation::new(Command::Version, self.paths.clone()), &stdin).await {
            Ok(output) => serde_json::from_slice::<VersionInfo>(&output.stdout).map_err(|e| Error::BadOutput {
                plugin: plugin_type.to_owned(),
                command: Command::Version,
                reason: e.to_string(),
                stdout: excerpt(&output.stdout),
            })?,
            Err(Error::Plugin { error, .. }) if error.msg == "unknown CNI_COMMAND: VERSION" => VersionInfo::legacy(),
            Err(e) => return Err(e),
        };
        self.lock_versions().insert(path, (modified, info.clone()));
        Ok(info)
    }

    async fn plugin_supports(&self, plugin: &PluginConf, version: Version) -> Result<bool, Error> {
        let info = self.version_info(&plugin.plugin_type).await?;
        let supported = info.supports(version);
        if !supported {
            debug!(plugin = %plugin.plugin_type, %version, "plugin does not support this version; skipped");
        }
        Ok(supported)
    }

    fn lock_versions(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (Option<SystemTime>, VersionInfo)>> {
        // The map holds plain values and no code panics while holding the lock.
        self.versions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn find(&self, plugin_type: &str) -> Result<PathBuf, Error> {
        self.exec
            .find(plugin_type, &self.paths)
            .ok_or_else(|| Error::PluginNotFound { plugin: plugin_type.to_owned(), paths: self.paths.clone() })
    }

    fn invocation(&self, command: Command, rt: &RuntimeConf) -> Invocation {
        Invocation {
            command,
            container_id: rt.container_id.clone(),
            netns: rt.netns.clone(),
            ifname: rt.ifname.clone(),
            args: rt.args.clone(),
            path: self.paths.clone(),
        }
    }

    /// Runs one plugin with the timeout; a non-zero exit becomes the plugin's error.
    async fn run(&self, plugin_type: &str, invocation: Invocation, stdin: &[u8]) -> Result<Output, Error> {
        let path = self.find(plugin_type)?;
        let command = invocation.command;
        debug!(plugin = plugin_type, %command, container = %invocation.container_id, "running CNI plugin");
        let output = match tokio::time::timeout(self.timeout, self.exec.exec(&path, &invocation, stdin)).await {
            Err(_) => return Err(Error::Timeout { plugin: plugin_type.to_owned(), command, after: self.timeout }),
            Ok(Err(source)) => return Err(Error::Spawn { plugin: plugin_type.to_owned(), command, source }),
            Ok(Ok(output)) => output,
        };
        if output.exit.success() {
            return Ok(output);
        }
        let stderr = excerpt(&output.stderr);
        Err(match serde_json::from_slice::<PluginError>(&output.stdout) {
            Ok(error) => Error::Plugin { plugin: plugin_type.to_owned(), command, error, exit: output.exit, stderr },
            Err(_) => Error::Crashed {
                plugin: plugin_type.to_owned(),
                command,
                exit: output.exit,
                stdout: excerpt(&output.stdout),
                stderr,
            },
        })
    }
}

/// Success when nothing failed; the one error, or all of them.
fn all_or_errors(mut errors: Vec<Error>) -> Result<(), Error> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Multiple(errors)),
    }
}

/// The version ADD used: the cached configuration's, when it can be read, else the list's.
fn add_version(list: &NetworkList, cached: Option<&CacheEntry>) -> Version {
    cached
        .and_then(|c| NetworkList::from_slice(&c.config).or_else(|_| NetworkList::from_single_slice(&c.config)).ok())
        .map(|cached_list| cached_list.cni_version)
        .filter(|v| v.is_supported())
        .unwrap_or(list.cni_version)
}

/// The cached result as `prevResult` in `version`, when the version passes one (`from` on).
fn previous_result(cached: Option<&CacheEntry>, version: Version, from: Version) -> Option<AddResult> {
    if version < from {
        return None;
    }
    let raw = cached?.result.clone()?;
    match AddResult::from_value(raw).and_then(|r| r.to_version(version)) {
        Ok(result) => Some(result),
        Err(e) => {
            warn!(error = %e, "cached result cannot be used as prevResult");
            None
        }
    }
}

/// The JSON one plugin gets on stdin: its configuration with the list's name and version, the
/// previous result, and `runtimeConfig` holding the capability arguments it declared.
pub(crate) fn plugin_object(
    name: &str,
    version: Version,
    plugin: &PluginConf,
    previous: Option<&AddResult>,
    rt: Option<&RuntimeConf>,
) -> Result<Map<String, Value>, Error> {
    let Value::Object(mut object) = serde_json::to_value(plugin).map_err(|e| json_error(&e))? else {
        return Err(Error::Config(crate::ConfigError::syntax("a plugin configuration must be a JSON object")));
    };
    object.insert("name".into(), Value::String(name.to_owned()));
    object.insert("cniVersion".into(), Value::String(version.to_string()));
    if let Some(previous) = previous {
        object.insert("prevResult".into(), previous.to_json()?);
    }
    if let Some(rt) = rt {
        let runtime_config: Map<String, Value> = plugin
            .enabled_capabilities()
            .filter_map(|capability| rt.capability_args.get(capability).map(|v| (capability.to_owned(), v.clone())))
            .collect();
        if !runtime_config.is_empty() {
            object.insert("runtimeConfig".into(), Value::Object(runtime_config));
        }
    }
    Ok(object)
}

fn plugin_stdin(
    name: &str,
    version: Version,
    plugin: &PluginConf,
    previous: Option<&AddResult>,
    rt: Option<&RuntimeConf>,
) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(&plugin_object(name, version, plugin, previous, rt)?).map_err(|e| json_error(&e))
}

fn bad_output(plugin: &PluginConf, command: Command, error: Error, stdout: &[u8]) -> Error {
    match error {
        Error::BadOutput { reason, .. } => {
            Error::BadOutput { plugin: plugin.plugin_type.clone(), command, reason, stdout: excerpt(stdout) }
        }
        Error::IncompatibleVersion { details } => Error::BadOutput {
            plugin: plugin.plugin_type.clone(),
            command,
            reason: format!("incompatible result version: {details}"),
            stdout: excerpt(stdout),
        },
        other => other,
    }
}

fn json_error(e: &serde_json::Error) -> Error {
    Error::Config(crate::ConfigError::syntax(e.to_string()))
}
