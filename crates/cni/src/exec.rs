//! Running plugin binaries: the [`Exec`] seam and [`RawExec`], which forks and execs.

use std::{
    ffi::OsString,
    fmt, io,
    path::{Path, PathBuf},
    process::Stdio,
};

use tokio::io::AsyncWriteExt;

/// A CNI command, as sent in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Command {
    /// Attach a container to a network.
    Add,
    /// Detach it.
    Del,
    /// Check that the attachment is as ADD left it (0.4.0+).
    Check,
    /// Ask whether the plugin is ready for ADDs (1.1.0+).
    Status,
    /// Remove resources of attachments that no longer exist (1.1.0+).
    Gc,
    /// Ask which spec versions the plugin supports.
    Version,
}

impl Command {
    /// The value of `CNI_COMMAND`.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a plugin receives besides its configuration: the `CNI_*` environment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Invocation {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`; empty for STATUS, GC and VERSION.
    pub container_id: String,
    /// `CNI_NETNS`; empty for commands without a container.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, as `K=V` pairs joined with `;`.
    pub args: Vec<(String, String)>,
    /// `CNI_PATH`: where the plugin finds its delegates (IPAM plugins).
    pub path: Vec<PathBuf>,
}

impl Invocation {
    /// An invocation of `command` with no container.
    pub fn new(command: Command, path: Vec<PathBuf>) -> Self {
        Invocation {
            command,
            container_id: String::new(),
            netns: String::new(),
            ifname: String::new(),
            args: Vec::new(),
            path,
        }
    }

    /// The `CNI_*` variables, empty ones left out as libcni does.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = vec![("CNI_COMMAND", OsString::from(self.command.as_str()))];
        let mut put = |key, value: &str| {
            if !value.is_empty() {
                env.push((key, OsString::from(value)));
            }
        };
        put("CNI_CONTAINERID", &self.container_id);
        put("CNI_NETNS", &self.netns);
        put("CNI_IFNAME", &self.ifname);
        let args: Vec<String> = self.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        put("CNI_ARGS", &args.join(";"));
        if let Ok(path) = std::env::join_paths(&self.path) {
            env.push(("CNI_PATH", path));
        }
        env
    }
}

/// How a plugin process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    /// Exit code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => write!(f, "killed by signal {signal}"),
        }
    }
}

/// What a plugin process left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Output {
    /// How it ended.
    pub exit: Exit,
    /// Its stdout: a result or an error JSON.
    pub stdout: Vec<u8>,
    /// Its stderr: logs, kept for error messages.
    pub stderr: Vec<u8>,
}

impl Output {
    /// An output.
    pub fn new(exit: Exit, stdout: impl Into<Vec<u8>>, stderr: impl Into<Vec<u8>>) -> Self {
        Output { exit, stdout: stdout.into(), stderr: stderr.into() }
    }
}

/// Runs plugins; substitute it to test code that uses [`Cni`](crate::Cni) without binaries.
///
/// Cancellation: when the returned future is dropped (the [`Cni`](crate::Cni) timeout does
/// this), the implementation must stop the plugin.
#[async_trait::async_trait]
pub trait Exec: Send + Sync {
    /// Runs the plugin at `plugin` with `invocation`'s environment and `stdin` as its input.
    async fn exec(&self, plugin: &Path, invocation: &Invocation, stdin: &[u8]) -> io::Result<Output>;

    /// Finds the binary for `plugin_type` in `paths`, first match wins.
    fn find(&self, plugin_type: &str, paths: &[PathBuf]) -> Option<PathBuf> {
        paths.iter().map(|dir| dir.join(plugin_type)).find(|p| is_executable(p))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The `PATH` plugins get when the agent's own is unset.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Forks and execs plugin binaries.
///
/// The environment is clean: the `CNI_*` variables and `PATH` only (plugins such as `portmap`
/// and `bridge` with `ipMasq` run `iptables`, which they find on `PATH`).
/// Each plugin runs in its own process group, so a cancelled run kills the plugin and any
/// delegate it started.
#[derive(Debug, Clone)]
pub struct RawExec {
    path_env: OsString,
}

impl Default for RawExec {
    fn default() -> Self {
        RawExec { path_env: std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()) }
    }
}

impl RawExec {
    /// An executor that passes this `PATH` to plugins.
    pub fn with_path_env(path_env: impl Into<OsString>) -> Self {
        RawExec { path_env: path_env.into() }
    }
}

#[async_trait::async_trait]
impl Exec for RawExec {
    async fn exec(&self, plugin: &Path, invocation: &Invocation, stdin: &[u8]) -> io::Result<Output> {
        let mut child = tokio::process::Command::new(plugin)
            .env_clear()
            .env("PATH", &self.path_env)
            .envs(invocation.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let group = GroupGuard(child.id());
        let input = child.stdin.take();
        let write = async move {
            if let Some(mut input) = input {
                // A plugin may exit without reading its input; that is its answer, not ours.
                match input.write_all(stdin).await {
                    Err(e) if e.kind() != io::ErrorKind::BrokenPipe => return Err(e),
                    _ => {}
                }
            }
            Ok(())
        };
        let (written, output) = tokio::join!(write, child.wait_with_output());
        let output = output?;
        group.disarm();
        written?;
        use std::os::unix::process::ExitStatusExt;
        let exit = match (output.status.code(), output.status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            (None, None) => Exit::Code(-1),
        };
        Ok(Output { exit, stdout: output.stdout, stderr: output.stderr })
    }
}

/// Kills a plugin's process group if the run is abandoned before the plugin was reaped.
struct GroupGuard(Option<u32>);

impl GroupGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|pid| i32::try_from(pid).ok()) {
            // The group leader has not been reaped (we are dropped before `wait` returned), so
            // its group ID cannot have been reused.
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_leaves_out_empty_variables() {
        let mut inv = Invocation::new(Command::Add, vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()]);
        inv.container_id = "c1".into();
        inv.netns = "/var/run/netns/x".into();
        inv.ifname = "eth0".into();
        inv.args = vec![("K8S_POD_NAME".into(), "web".into()), ("IgnoreUnknown".into(), "1".into())];
        let env: Vec<(&str, String)> = inv.env().into_iter().map(|(k, v)| (k, v.into_string().unwrap())).collect();
        assert_eq!(
            env,
            [
                ("CNI_COMMAND", "ADD".to_owned()),
                ("CNI_CONTAINERID", "c1".to_owned()),
                ("CNI_NETNS", "/var/run/netns/x".to_owned()),
                ("CNI_IFNAME", "eth0".to_owned()),
                ("CNI_ARGS", "K8S_POD_NAME=web;IgnoreUnknown=1".to_owned()),
                ("CNI_PATH", "/usr/lib/cni:/opt/cni/bin".to_owned()),
            ]
        );
        let version = Invocation::new(Command::Version, vec![]);
        let keys: Vec<&str> = version.env().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["CNI_COMMAND", "CNI_PATH"]);
    }
}
