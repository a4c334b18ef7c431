//! Tests of [`Cni`] with a scripted executor (no binaries) and with shell-script plugins.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};

use crate::*;

/// One recorded plugin run.
#[derive(Debug, Clone)]
struct Call {
    plugin: String,
    command: Command,
    stdin: Value,
    container_id: String,
}

type Reply = Box<dyn Fn(&Call) -> Output + Send + Sync>;

/// Answers plugin runs from a function and records them.
struct Scripted {
    calls: Mutex<Vec<Call>>,
    reply: Reply,
    hang: bool,
}

impl Scripted {
    fn new(reply: impl Fn(&Call) -> Output + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Scripted { calls: Mutex::new(Vec::new()), reply: Box::new(reply), hang: false })
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Exec for Scripted {
    async fn exec(&self, plugin: &Path, invocation: &Invocation, stdin: &[u8]) -> io::Result<Output> {
        let call = Call {
            plugin: plugin.file_name().unwrap().to_string_lossy().into_owned(),
            command: invocation.command,
            stdin: serde_json::from_slice(stdin).unwrap(),
            container_id: invocation.container_id.clone(),
        };
        self.calls.lock().unwrap().push(call.clone());
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok((self.reply)(&call))
    }

    fn find(&self, plugin_type: &str, paths: &[PathBuf]) -> Option<PathBuf> {
        (plugin_type != "missing").then(|| paths[0].join(plugin_type))
    }
}

fn ok(stdout: Value) -> Output {
    Output::new(Exit::Code(0), serde_json::to_vec(&stdout).unwrap(), Vec::new())
}

/// A plugin that appends its own interface to the previous result, as chained plugins do.
fn chaining(call: &Call) -> Output {
    match call.command {
        Command::Add => {
            let mut result = call.stdin.get("prevResult").cloned().unwrap_or_else(|| {
                json!({"cniVersion": call.stdin["cniVersion"], "interfaces": [], "ips": [{"address":"10.9.0.5/24","gateway":"10.9.0.1"}]})
            });
            result["interfaces"].as_array_mut().unwrap().push(json!({"name": call.plugin}));
            result["cniVersion"] = call.stdin["cniVersion"].clone();
            ok(result)
        }
        Command::Version => ok(json!({"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]})),
        _ => Output::new(Exit::Code(0), Vec::new(), Vec::new()),
    }
}

fn network(version: &str, plugins: Value) -> NetworkList {
    NetworkList::from_slice(
        &serde_json::to_vec(&json!({"cniVersion": version, "name": "net", "plugins": plugins})).unwrap(),
    )
    .unwrap()
}

fn three_plugins(version: &str) -> NetworkList {
    network(
        version,
        json!([{"type":"bridge","bridge":"br0"},{"type":"portmap","capabilities":{"portMappings":true}},{"type":"tuning"}]),
    )
}

fn cni(exec: Arc<dyn Exec>, cache: &Path) -> Cni {
    Cni::new(vec!["/plugins".into()]).with_exec(exec).with_cache(Cache::new(cache))
}

fn rt() -> RuntimeConf {
    RuntimeConf::new("c1", "/var/run/netns/c1", "eth0")
        .with_capability("portMappings", json!([{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]))
        .with_capability("bandwidth", json!({"ingressRate":1000}))
}

#[tokio::test]
async fn add_chains_prev_result_injects_capabilities_and_caches() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let list = three_plugins("1.0.0");

    let result = cni.add_network_list(&list, &rt()).await.unwrap();
    let names: Vec<&str> = result.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["bridge", "portmap", "tuning"]);

    let calls = exec.calls();
    let order: Vec<(&str, Command)> = calls.iter().map(|c| (c.plugin.as_str(), c.command)).collect();
    assert_eq!(order, [("bridge", Command::Add), ("portmap", Command::Add), ("tuning", Command::Add)]);
    for call in &calls {
        assert_eq!(call.stdin["name"], "net");
        assert_eq!(call.stdin["cniVersion"], "1.0.0");
        assert_eq!(call.container_id, "c1");
    }
    assert_eq!(calls[0].stdin["bridge"], "br0", "plugin keys pass through");
    assert!(calls[0].stdin.get("prevResult").is_none());
    assert_eq!(calls[1].stdin["prevResult"]["interfaces"], json!([{"name":"bridge"}]));
    assert_eq!(calls[2].stdin["prevResult"]["interfaces"], json!([{"name":"bridge"},{"name":"portmap"}]));
    // Only portmap declared a capability, and only that one is passed to it.
    assert!(calls[0].stdin.get("runtimeConfig").is_none());
    assert_eq!(
        calls[1].stdin["runtimeConfig"],
        json!({"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]})
    );
    assert!(calls[2].stdin.get("runtimeConfig").is_none());

    let cached = cni.cached_result(&list, &rt()).await.unwrap().unwrap();
    assert_eq!(cached, result);
}

#[tokio::test]
async fn capabilities_set_to_false_are_not_injected() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let list = network("1.0.0", json!([{"type":"bandwidth","capabilities":{"bandwidth":false,"portMappings":true}}]));
    cni(exec.clone(), dir.path()).add_network_list(&list, &rt()).await.unwrap();
    assert_eq!(
        exec.calls()[0].stdin["runtimeConfig"],
        json!({"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]})
    );
}

#[tokio::test]
async fn del_runs_in_reverse_with_the_cached_result_and_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let list = three_plugins("1.0.0");
    let added = cni.add_network_list(&list, &rt()).await.unwrap();

    // A new instance: what it knows comes from the cache on disk.
    let after_restart = self::cni(exec.clone(), dir.path());
    after_restart.del_network_list(&list, &rt()).await.unwrap();
    let dels: Vec<Call> = exec.calls().into_iter().filter(|c| c.command == Command::Del).collect();
    let order: Vec<&str> = dels.iter().map(|c| c.plugin.as_str()).collect();
    assert_eq!(order, ["tuning", "portmap", "bridge"]);
    for del in &dels {
        assert_eq!(del.stdin["prevResult"], added.to_json().unwrap());
    }
    assert_eq!(after_restart.cached_result(&list, &rt()).await.unwrap(), None);

    // A second DEL runs the plugins again (they are idempotent), without a prevResult.
    after_restart.del_network_list(&list, &rt()).await.unwrap();
    let second: Vec<Call> = exec.calls().into_iter().filter(|c| c.command == Command::Del).skip(3).collect();
    assert_eq!(second.len(), 3);
    assert!(second.iter().all(|c| c.stdin.get("prevResult").is_none()));
}

#[tokio::test]
async fn del_uses_the_version_add_used() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    cni.add_network_list(&three_plugins("0.4.0"), &rt()).await.unwrap();
    // The file changed to 1.0.0 while the container ran.
    cni.del_network_list(&three_plugins("1.0.0"), &rt()).await.unwrap();
    let dels: Vec<Call> = exec.calls().into_iter().filter(|c| c.command == Command::Del).collect();
    for del in &dels {
        assert_eq!(del.stdin["cniVersion"], "0.4.0");
        assert_eq!(del.stdin["prevResult"]["cniVersion"], "0.4.0");
        assert_eq!(del.stdin["prevResult"]["ips"][0]["version"], "4");
    }
}

#[tokio::test]
async fn del_before_0_4_0_sends_no_prev_result() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let list = three_plugins("0.3.1");
    cni.add_network_list(&list, &rt()).await.unwrap();
    cni.del_network_list(&list, &rt()).await.unwrap();
    assert!(exec.calls().iter().filter(|c| c.command == Command::Del).all(|c| c.stdin.get("prevResult").is_none()));
}

#[tokio::test]
async fn check_runs_in_order_with_the_cached_result() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let list = three_plugins("1.0.0");
    let err = cni.check_network_list(&list, &rt()).await.unwrap_err();
    assert!(matches!(err, Error::NoCachedResult { .. }), "{err}");

    let added = cni.add_network_list(&list, &rt()).await.unwrap();
    cni.check_network_list(&list, &rt()).await.unwrap();
    let checks: Vec<Call> = exec.calls().into_iter().filter(|c| c.command == Command::Check).collect();
    let order: Vec<&str> = checks.iter().map(|c| c.plugin.as_str()).collect();
    assert_eq!(order, ["bridge", "portmap", "tuning"]);
    assert!(checks.iter().all(|c| c.stdin["prevResult"] == added.to_json().unwrap()));

    let old = three_plugins("0.3.1");
    let err = cni.check_network_list(&old, &RuntimeConf::new("c2", "/x", "eth0")).await.unwrap_err();
    assert!(matches!(err, Error::NotSupported { command: Command::Check, .. }), "{err}");

    let mut disabled = list.clone();
    disabled.disable_check = true;
    let before = exec.calls().len();
    cni.check_network_list(&disabled, &rt()).await.unwrap();
    assert_eq!(exec.calls().len(), before);
}

#[tokio::test]
async fn check_stops_at_the_first_failing_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(|call| {
        if call.command == Command::Check && call.plugin == "portmap" {
            Output::new(Exit::Code(1), br#"{"code":999,"msg":"could not check"}"#.to_vec(), Vec::new())
        } else {
            chaining(call)
        }
    });
    let cni = cni(exec.clone(), dir.path());
    let list = three_plugins("1.0.0");
    cni.add_network_list(&list, &rt()).await.unwrap();
    let err = cni.check_network_list(&list, &rt()).await.unwrap_err();
    assert!(matches!(&err, Error::Plugin { plugin, error, .. } if plugin == "portmap" && error.code == 999), "{err}");
    let checked: Vec<String> =
        exec.calls().into_iter().filter(|c| c.command == Command::Check).map(|c| c.plugin).collect();
    assert_eq!(checked, ["bridge", "portmap"]);
}

#[tokio::test]
async fn status_and_gc_need_1_1_0_and_a_plugin_that_supports_it() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(|call| match (call.command, call.plugin.as_str()) {
        (Command::Version, "old") => ok(json!({"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]})),
        _ => chaining(call),
    });
    let cni = cni(exec.clone(), dir.path());
    let list = network("1.1.0", json!([{"type":"bridge"},{"type":"old"}]));
    cni.status_network_list(&list).await.unwrap();
    cni.status_network_list(&network("1.0.0", json!([{"type":"bridge"}]))).await.unwrap();
    let statuses: Vec<Call> = exec.calls().into_iter().filter(|c| c.command == Command::Status).collect();
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].plugin, "bridge");
    assert_eq!(statuses[0].stdin["cniVersion"], "1.1.0");
    assert_eq!(statuses[0].container_id, "");

    // VERSION is asked once per plugin binary.
    cni.status_network_list(&list).await.unwrap();
    let versions = exec.calls().into_iter().filter(|c| c.command == Command::Version).count();
    assert_eq!(versions, 2);
}

#[tokio::test]
async fn gc_deletes_stale_attachments_and_sends_valid_ones_to_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let list = network("1.1.0", json!([{"type":"bridge"}]));
    let other =
        NetworkList::from_slice(br#"{"cniVersion":"1.1.0","name":"other","plugins":[{"type":"bridge"}]}"#).unwrap();
    for id in ["keep", "stale1", "stale2"] {
        cni.add_network_list(&list, &RuntimeConf::new(id, format!("/ns/{id}"), "eth0")).await.unwrap();
    }
    cni.add_network_list(&other, &RuntimeConf::new("elsewhere", "/ns/e", "eth0")).await.unwrap();

    cni.gc_network_list(&list, Some(&[GcAttachment::new("keep", "eth0")])).await.unwrap();
    let deleted: Vec<String> =
        exec.calls().into_iter().filter(|c| c.command == Command::Del).map(|c| c.container_id).collect();
    assert_eq!(deleted, ["stale1", "stale2"]);
    let gc: Vec<Call> = exec.calls().into_iter().filter(|c| c.command == Command::Gc).collect();
    assert_eq!(gc.len(), 1);
    assert_eq!(gc[0].stdin["cni.dev/valid-attachments"], json!([{"containerID":"keep","ifname":"eth0"}]));
    let left: Vec<String> = cni.cache().attachments(None).await.unwrap().into_iter().map(|e| e.container_id).collect();
    assert_eq!(left, ["keep", "elsewhere"], "file name order");
}

#[tokio::test]
async fn plugin_errors_keep_code_msg_details_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    // Every error shape of runtime-recipe.md, as the Debian plugins print them.
    let shapes = [
        (r#"{"code":4,"msg":"required env variables [CNI_NETNS] missing"}"#, 4, ""),
        (r#"{"code":4,"msg":"unknown CNI_COMMAND: BOGUS"}"#, 4, ""),
        (r#"{"code":6,"msg":"error unmarshall network config: unexpected end of JSON input"}"#, 6, ""),
        (
            r#"{"code":1,"msg":"incompatible CNI versions","details":"config is \"1.1.0\", plugin supports [\"0.1.0\" \"0.2.0\" \"0.3.0\" \"0.3.1\" \"0.4.0\" \"1.0.0\"]"}"#,
            1,
            r#"config is "1.1.0", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0"]"#,
        ),
        (
            r#"{"code":999,"msg":"failed to open netns \"/var/run/netns/does-not-exist\": no such file or directory"}"#,
            999,
            "",
        ),
        (r#"{"code":999,"msg":"failed to find plugin \"no-such-ipam\" in path [/usr/lib/cni]"}"#, 999, ""),
        (r#"{"code":999,"msg":"host-local: Failed to find address added by container e8"}"#, 999, ""),
        (r#"{"cniVersion":"1.0.0","code":11,"msg":"try again later","details":"busy"}"#, 11, "busy"),
    ];
    for (stdout, code, details) in shapes {
        let exec =
            Scripted::new(move |_| Output::new(Exit::Code(1), stdout.as_bytes().to_vec(), b"some log\n".to_vec()));
        let err = cni(exec, dir.path()).add_network_list(&three_plugins("1.0.0"), &rt()).await.unwrap_err();
        let Error::Plugin { plugin, command, error, exit, stderr } = &err else { panic!("{stdout}: {err}") };
        assert_eq!((plugin.as_str(), *command, error.code, *exit), ("bridge", Command::Add, code, Exit::Code(1)));
        assert_eq!(error.details, details);
        assert_eq!(stderr, "some log\n");
        assert_eq!(err.code(), code);
        let shown = err.to_string();
        assert!(shown.contains(&error.msg) && shown.contains("some log"), "{shown}");
    }
}

#[tokio::test]
async fn bad_arguments_are_refused_before_any_plugin_runs() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let list = three_plugins("1.0.0");
    for (id, ifname) in
        [("", "eth0"), ("-bad", "eth0"), ("c1", ""), ("c1", "much-too-long-ifname"), ("c1", "a/b"), ("c1", "..")]
    {
        let err = cni.add_network_list(&list, &RuntimeConf::new(id, "/ns", ifname)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{id} {ifname}: {err}");
        assert_eq!(err.code(), 4);
    }
    let unknown = network("9.9.9", json!([{"type":"bridge"}]));
    let err = cni.add_network_list(&unknown, &rt()).await.unwrap_err();
    assert_eq!(err.code(), 1);
    assert!(err.to_string().contains("config is \"9.9.9\""), "{err}");
    let err = cni.add_network_list(&network("1.0.0", json!([{"type":"missing"}])), &rt()).await.unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    assert!(exec.calls().is_empty());
}

#[tokio::test]
async fn validate_reports_versions_and_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(|call| match (call.command, call.plugin.as_str()) {
        (Command::Version, "old") => ok(json!({"cniVersion":"0.4.0","supportedVersions":["0.3.1","0.4.0"]})),
        _ => chaining(call),
    });
    let cni = cni(exec, dir.path());
    let caps = cni.validate_network_list(&three_plugins("1.0.0")).await.unwrap();
    assert_eq!(caps, ["portMappings"]);
    let err =
        cni.validate_network_list(&network("1.0.0", json!([{"type":"old"},{"type":"missing"}]))).await.unwrap_err();
    let Error::Multiple(errors) = &err else { panic!("{err}") };
    assert!(matches!(errors[0], Error::IncompatibleVersion { .. }));
    assert!(matches!(errors[1], Error::PluginNotFound { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_plugin_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Arc::new(Scripted { calls: Mutex::new(Vec::new()), reply: Box::new(chaining), hang: true });
    let cni = cni(exec, dir.path()).with_timeout(Duration::from_secs(5));
    let err = cni.add_network_list(&three_plugins("1.0.0"), &rt()).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { after, .. } if after == Duration::from_secs(5)), "{err}");
}

#[tokio::test]
async fn single_network_variants_are_one_element_lists() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Scripted::new(chaining);
    let cni = cni(exec.clone(), dir.path());
    let plugin = PluginConf::new("loopback");
    cni.add_network("lo", Version::V1_0_0, &plugin, &rt()).await.unwrap();
    cni.check_network("lo", Version::V1_0_0, &plugin, &rt()).await.unwrap();
    cni.del_network("lo", Version::V1_0_0, &plugin, &rt()).await.unwrap();
    let seen: Vec<(Command, Value)> = exec.calls().into_iter().map(|c| (c.command, c.stdin["name"].clone())).collect();
    assert_eq!(seen, [(Command::Add, json!("lo")), (Command::Check, json!("lo")), (Command::Del, json!("lo"))]);
}

/// Shell-script plugins run by [`RawExec`]: real processes, no root needed.
mod scripts {
    use super::*;

    fn plugin_dir(scripts: &[(&str, &str)]) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in scripts {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    fn real_cni(plugins: &Path, cache: &Path) -> Cni {
        Cni::new(vec![plugins.to_owned()]).with_cache(Cache::new(cache)).with_timeout(Duration::from_secs(10))
    }

    fn single(plugin: &str) -> NetworkList {
        network("1.0.0", json!([{ "type": plugin }]))
    }

    #[tokio::test]
    async fn a_plugin_sees_a_clean_environment_and_its_config_on_stdin() {
        let plugins = plugin_dir(&[(
            "envdump",
            r#"cat > "$(dirname "$0")/stdin.json"; env | sort > "$(dirname "$0")/env.txt"
echo '{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}'"#,
        )]);
        let cache = tempfile::tempdir().unwrap();
        let rt = RuntimeConf::new("c1", "/var/run/netns/c1", "eth0").with_arg("K8S_POD_NAME", "web");
        let result = real_cni(plugins.path(), cache.path()).add_network_list(&single("envdump"), &rt).await.unwrap();
        assert_eq!(result.ips[0].address.to_string(), "10.0.0.2/24");
        let env = std::fs::read_to_string(plugins.path().join("env.txt")).unwrap();
        let keys: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split('=').next())
            .filter(|k| *k != "PWD" && *k != "SHLVL" && *k != "_")
            .collect();
        assert_eq!(
            keys,
            ["CNI_ARGS", "CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_PATH", "PATH"],
            "{env}"
        );
        assert!(env.contains("CNI_ARGS=K8S_POD_NAME=web\n"));
        let stdin: Value =
            serde_json::from_str(&std::fs::read_to_string(plugins.path().join("stdin.json")).unwrap()).unwrap();
        assert_eq!(stdin, json!({"cniVersion":"1.0.0","name":"net","type":"envdump"}));
    }

    #[tokio::test]
    async fn a_crash_reports_exit_status_and_stderr() {
        let plugins = plugin_dir(&[("crash", "echo 'panic: runtime error' >&2; exit 2"), ("segv", "kill -SEGV $$")]);
        let cache = tempfile::tempdir().unwrap();
        let cni = real_cni(plugins.path(), cache.path());
        let err = cni.add_network_list(&single("crash"), &rt()).await.unwrap_err();
        assert!(
            matches!(&err, Error::Crashed { exit: Exit::Code(2), stderr, .. } if stderr.contains("panic")),
            "{err}"
        );
        let err = cni.add_network_list(&single("segv"), &rt()).await.unwrap_err();
        assert!(matches!(&err, Error::Crashed { exit: Exit::Signal(11), .. }), "{err}");
        assert!(err.to_string().contains("signal 11"), "{err}");
    }

    #[tokio::test]
    async fn garbage_on_stdout_is_a_bad_output_error() {
        let plugins = plugin_dir(&[("garbage", "echo 'hello, I am not JSON'"), ("wrongshape", "echo '[1,2,3]'")]);
        let cache = tempfile::tempdir().unwrap();
        let cni = real_cni(plugins.path(), cache.path());
        for plugin in ["garbage", "wrongshape"] {
            let err = cni.add_network_list(&single(plugin), &rt()).await.unwrap_err();
            assert!(matches!(&err, Error::BadOutput { plugin: p, .. } if p == plugin), "{err}");
            assert_eq!(err.code(), 6);
        }
        // Garbage with a failing exit is a crash, its output kept for the message.
        let plugins = plugin_dir(&[("garbage", "echo 'not json'; exit 1")]);
        let err = real_cni(plugins.path(), cache.path()).add_network_list(&single("garbage"), &rt()).await.unwrap_err();
        assert!(matches!(&err, Error::Crashed { stdout, .. } if stdout.contains("not json")), "{err}");
        // Nothing was cached for the failed ADDs.
        assert!(Cache::new(cache.path()).attachments(None).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_killed_with_its_children() {
        let plugins = plugin_dir(&[("hang", r#"sleep 300 & echo $! > "$(dirname "$0")/child.pid"; wait"#)]);
        let cache = tempfile::tempdir().unwrap();
        let cni = real_cni(plugins.path(), cache.path()).with_timeout(Duration::from_millis(500));
        let err = cni.add_network_list(&single("hang"), &rt()).await.unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        let pid: i32 = std::fs::read_to_string(plugins.path().join("child.pid")).unwrap().trim().parse().unwrap();
        // The delegate-like child was in the plugin's process group and got SIGKILL.
        let mut gone = false;
        for _ in 0..100 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            if state.is_none_or(|s| s.split_whitespace().nth(2) == Some("Z")) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "child {pid} of the timed-out plugin still runs");
    }

    #[tokio::test]
    async fn version_is_asked_once_and_again_when_the_binary_changes() {
        let plugins = plugin_dir(&[(
            "counted",
            r#"echo run >> "$(dirname "$0")/runs"; echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'"#,
        )]);
        let cache = tempfile::tempdir().unwrap();
        let cni = real_cni(plugins.path(), cache.path());
        let info = cni.version_info("counted").await.unwrap();
        assert!(info.supports(Version::V1_0_0) && !info.supports(Version::V1_1_0));
        cni.version_info("counted").await.unwrap();
        let runs = || std::fs::read_to_string(plugins.path().join("runs")).unwrap().lines().count();
        assert_eq!(runs(), 1);
        // A new binary (new mtime) is asked again.
        let path = plugins.path().join("counted");
        let later = std::time::SystemTime::now() + Duration::from_secs(10);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        cni.version_info("counted").await.unwrap();
        assert_eq!(runs(), 2);
    }

    #[tokio::test]
    async fn a_plugin_too_old_for_version_supports_0_1_0() {
        let plugins = plugin_dir(&[("ancient", r#"echo '{"code":4,"msg":"unknown CNI_COMMAND: VERSION"}'; exit 1"#)]);
        let cache = tempfile::tempdir().unwrap();
        let info = real_cni(plugins.path(), cache.path()).version_info("ancient").await.unwrap();
        assert_eq!(info.supported_versions, ["0.1.0"]);
    }
}
