//! Errors: what a plugin reported, what went wrong running it, and bad configuration.

use std::{fmt, io, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::exec::{Command, Exit};

/// The error JSON a plugin prints on stdout when it fails (`code`, `msg`, `details`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PluginError {
    /// The CNI error code: 1 incompatible version, 4 bad environment, 6 decoding failure,
    /// 7 invalid configuration, 11 try again later, 999 anything else.
    pub code: u32,
    /// A short message.
    pub msg: String,
    /// A longer description; empty when the plugin gave none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl PluginError {
    /// An error with a code and message.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        PluginError { code, msg: msg.into(), details: details.into() }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "code {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, "; {}", self.details)?;
        }
        Ok(())
    }
}

/// A configuration file or document that cannot be used, naming the file and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct ConfigError {
    /// The file, when the configuration came from one.
    pub path: Option<PathBuf>,
    /// The field, as a path such as `plugins[1].type`; `None` for a syntax error.
    pub field: Option<String>,
    /// What is wrong, with line and column for syntax errors.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { path: None, field: Some(field.into()), message: message.into() }
    }

    pub(crate) fn syntax(message: impl Into<String>) -> Self {
        ConfigError { path: None, field: None, message: message.into() }
    }

    pub(crate) fn in_file(mut self, path: Option<&std::path::Path>) -> Self {
        if self.path.is_none() {
            self.path = path.map(ToOwned::to_owned);
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        if let Some(field) = &self.field {
            write!(f, "field {field}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Everything a CNI operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A network configuration that cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No network of that name in the configuration directory.
    #[error("no network configuration named {name:?} in {}{}", dir.display(), invalid_note(invalid))]
    NetworkNotFound {
        /// The name asked for.
        name: String,
        /// The directory searched.
        dir: PathBuf,
        /// Files skipped because they are invalid (one of them may be the one meant).
        invalid: Vec<ConfigError>,
    },
    /// The configuration directory holds no usable network.
    #[error("no network configurations found in {}{}", dir.display(), invalid_note(invalid))]
    NoNetworks {
        /// The directory searched.
        dir: PathBuf,
        /// Files skipped because they are invalid.
        invalid: Vec<ConfigError>,
    },
    /// A plugin binary is not in any directory of the plugin path.
    #[error("failed to find plugin {plugin:?} in path {paths:?}")]
    PluginNotFound {
        /// The plugin type.
        plugin: String,
        /// The directories searched.
        paths: Vec<PathBuf>,
    },
    /// A runtime argument (container ID, interface name, network name) is not valid.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The plugin failed and printed the CNI error JSON.
    #[error("plugin {plugin} failed ({command}): {error}{}", stderr_note(stderr))]
    Plugin {
        /// The plugin type.
        plugin: String,
        /// The command it ran.
        command: Command,
        /// What the plugin reported.
        error: PluginError,
        /// How it exited.
        exit: Exit,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// The plugin failed without printing an error JSON (a crash, a signal, garbage).
    #[error("plugin {plugin} failed ({command}): {exit}{}{}", output_note(stdout), stderr_note(stderr))]
    Crashed {
        /// The plugin type.
        plugin: String,
        /// The command it ran.
        command: Command,
        /// How it exited.
        exit: Exit,
        /// The start of what it wrote on stdout.
        stdout: String,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// The plugin exited 0 but its stdout is not what the command returns.
    #[error("plugin {plugin} ({command}) printed an invalid result: {reason}{}", output_note(stdout))]
    BadOutput {
        /// The plugin type.
        plugin: String,
        /// The command it ran.
        command: Command,
        /// Why the output was refused.
        reason: String,
        /// The start of what it wrote on stdout.
        stdout: String,
    },
    /// The plugin did not finish in time; its process group was killed.
    #[error("plugin {plugin} ({command}) timed out after {after:?}; killed")]
    Timeout {
        /// The plugin type.
        plugin: String,
        /// The command it ran.
        command: Command,
        /// The time it was given.
        after: Duration,
    },
    /// The plugin could not be started.
    #[error("failed to run plugin {plugin} ({command}): {source}")]
    Spawn {
        /// The plugin type.
        plugin: String,
        /// The command.
        command: Command,
        /// The OS error.
        source: io::Error,
    },
    /// A spec version this library cannot speak, or a result it cannot express in another version.
    #[error("incompatible CNI versions: {details}")]
    IncompatibleVersion {
        /// Which versions are involved.
        details: String,
    },
    /// The configuration's version does not have this command (CHECK before 0.4.0).
    #[error("configuration version {version} does not support the {command} command")]
    NotSupported {
        /// The configuration version.
        version: String,
        /// The command.
        command: Command,
    },
    /// CHECK needs the result of ADD, and there is none in the cache.
    #[error("no cached result for network {network:?}, container {container_id:?}, interface {ifname:?}")]
    NoCachedResult {
        /// The network name.
        network: String,
        /// The container ID.
        container_id: String,
        /// The interface name.
        ifname: String,
    },
    /// Reading or writing the result cache failed.
    #[error("result cache {}: {message}", path.display())]
    Cache {
        /// The cache file or directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// Several operations failed (GC deletes every stale attachment before reporting).
    #[error("{}", join(.0))]
    Multiple(Vec<Error>),
}

impl Error {
    /// Whether this is portmap's CHECK failing on an IPv6 chain an IPv4-only attachment never
    /// has (plugins 1.1.1, containernetworking/plugins#819): not a fault of the attachment.
    pub fn is_portmap_ipv6_check_bug(&self) -> bool {
        matches!(self, Error::Plugin { plugin, command: Command::Check, error, .. }
            if plugin == "portmap" && error.code == 999 && error.msg.contains("ipv6"))
    }

    /// The CNI error code that best describes this error, as `cnitool` users know them:
    /// the plugin's own code when it sent one, 1 for versions, 4 for bad arguments, 6 for
    /// undecodable output, 7 for invalid configuration, and 999 otherwise.
    pub fn code(&self) -> u32 {
        match self {
            Error::Plugin { error, .. } => error.code,
            Error::IncompatibleVersion { .. } | Error::NotSupported { .. } => 1,
            Error::InvalidArgument { .. } => 4,
            Error::BadOutput { .. } => 6,
            Error::Config(_) | Error::NetworkNotFound { .. } | Error::NoNetworks { .. } => 7,
            Error::Multiple(errors) => errors.first().map_or(999, Error::code),
            _ => 999,
        }
    }

    /// The error as the CNI error JSON (`code`, `msg`, `details`).
    pub fn to_plugin_error(&self) -> PluginError {
        match self {
            Error::Plugin { error, .. } => error.clone(),
            other => PluginError::new(other.code(), other.to_string(), ""),
        }
    }
}

fn join(errors: &[Error]) -> String {
    let parts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    parts.join("; ")
}

fn invalid_note(invalid: &[ConfigError]) -> String {
    if invalid.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = invalid.iter().map(ToString::to_string).collect();
        format!(" (skipped invalid: {})", parts.join("; "))
    }
}

fn stderr_note(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() { String::new() } else { format!("; stderr: {stderr}") }
}

fn output_note(stdout: &str) -> String {
    let stdout = stdout.trim();
    if stdout.is_empty() { String::new() } else { format!("; stdout: {stdout}") }
}

/// At most this many bytes of a plugin's output are kept in an error.
pub(crate) const OUTPUT_EXCERPT: usize = 2048;

/// The start of some output as text, for error messages.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(OUTPUT_EXCERPT)];
    String::from_utf8_lossy(cut).into_owned()
}
