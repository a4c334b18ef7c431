//! `kubelet-rs run --config`: a file the agent cannot use stops it before it starts, with exit
//! code 2 and a message naming the file, the field and the line; and upstream's invocation
//! (flags, no subcommand) with upstream's flags. No runtime needed.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{ffi::OsString, path::Path, process::Command};

/// A runtime endpoint nobody answers.
const NO_RUNTIME: &str = "unix:///nonexistent/cri.sock";

/// The flags that keep the binary off the host: every directory it may write under `dir`, no
/// healthz port, and `endpoint` for its runtime. Every test passes them, so one that gets
/// further than it should still touches neither the host's kubelet paths nor its runtime.
fn scratch(dir: &Path, endpoint: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--container-runtime-endpoint".into(), endpoint.into()];
    for (flag, sub) in [
        ("--root-dir", "root"),
        ("--pod-logs-dir", "pods"),
        ("--container-logs-dir", "containers"),
        ("--pod-manifest-path", "manifests"),
    ] {
        args.push(flag.into());
        args.push(dir.join(sub).into());
    }
    args.extend(["--healthz-port".into(), "0".into()]);
    args
}

fn run_with(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubelet.yaml");
    std::fs::write(&file, config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
        .args(["run", "--config"])
        .arg(&file)
        .args(scratch(dir.path(), NO_RUNTIME))
        .output()
        .unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

#[test]
fn bad_config_files_exit_2_naming_field_and_line() {
    for (body, field, line) in [
        ("staticPodPath: /etc/kubernetes/manifests\nsyncFrequncy: 1m\n", "syncFrequncy", 4),
        ("fileCheckFrequency: soon\n", "fileCheckFrequency", 3),
        ("healthzPort: 99999\n", "healthzPort", 3),
        ("cgroupDriver: systemd\n", "cgroupDriver", 3),
    ] {
        let (code, stderr) = run_with(&format!("{HEADER}{body}"));
        assert_eq!(code, Some(2), "{body}: {stderr}");
        assert!(stderr.contains("kubelet.yaml"), "{stderr}");
        assert!(stderr.contains(field) && stderr.contains(&format!("line {line}")), "{body}: {stderr}");
    }
    let (code, stderr) = run_with("apiVersion: v1\nkind: Pod\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("apiVersion"), "{stderr}");
}

#[test]
fn a_good_config_file_gets_past_parsing() {
    // The file is fine; the runtime is missing, so the agent fails later, with exit code 1.
    let (code, stderr) = run_with(&format!("{HEADER}syncFrequency: 30s\nreadOnlyPort: 0\n"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach the container runtime"), "{stderr}");
}

#[test]
fn json_logs_are_one_object_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = kubelet(dir.path(), NO_RUNTIME, &["--logging-format", "json"]);
    // Every line, the fatal error included, is one JSON object.
    let logs: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON object ({e}): {l:?}")))
        .collect();
    // component-base's keys: ts (milliseconds), caller, msg, v (not on errors), err.
    let started = logs.iter().find(|l| l["msg"] == "starting kubelet-rs").unwrap_or_else(|| panic!("{stderr}"));
    assert!(started["ts"].as_f64().is_some_and(|ts| ts > 1.7e12), "{started}");
    assert!(started["caller"].as_str().is_some_and(|c| c.starts_with("main.rs:")), "{started}");
    assert_eq!(started["v"], 0, "{started}");
    assert!(stderr.starts_with("{\"ts\":"), "ts leads, as upstream writes it: {stderr}");
    let failed = logs.last().expect("a last line");
    assert_eq!(failed["msg"], "command failed", "{stderr}");
    assert!(failed.get("v").is_none(), "an error has no verbosity: {failed}");
    let err = failed["err"].as_str().unwrap_or_default();
    assert!(err.contains("cannot reach the container runtime"), "{stderr}");
    // The cause chain once, on one line.
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert_eq!(code, Some(1));
}

#[test]
fn text_logs_are_klog_lines_without_colour() {
    let dir = tempfile::tempdir().unwrap();
    // `-v`, as upstream's shorthand for `--v`.
    let (_, _, stderr) = kubelet(dir.path(), NO_RUNTIME, &["-v", "2"]);
    assert!(!stderr.contains('\u{1b}'), "no ANSI escapes when stderr is not a terminal: {stderr:?}");
    // `Lmmdd hh:mm:ss.uuuuuu PID file:line] "message" key="value"`.
    for line in stderr.lines() {
        let (header, rest) = line.split_once("] ").unwrap_or_else(|| panic!("no klog header: {line:?}"));
        let (severity, date) = header.split_at(1);
        assert!(matches!(severity, "I" | "W" | "E"), "{line:?}");
        let parts: Vec<&str> = date.split_whitespace().collect();
        assert_eq!(parts.len(), 4, "{line:?}");
        assert!(parts[0].len() == 4 && parts[0].bytes().all(|b| b.is_ascii_digit()), "mmdd: {line:?}");
        assert!(parts[1].len() == 15 && parts[1].as_bytes()[8] == b'.', "hh:mm:ss.uuuuuu: {line:?}");
        let pid_padded = format!(" {:>7} ", parts[2]);
        assert!(parts[2].parse::<u32>().is_ok() && header.contains(&pid_padded), "the pid, 7 wide: {line:?}");
        assert!(parts[3].contains(".rs:"), "file:line: {line:?}");
        assert!(rest.starts_with('"'), "a quoted message: {line:?}");
    }
    let failed = stderr.lines().last().unwrap_or_default();
    assert!(failed.starts_with('E') && failed.contains("] \"command failed\" err=\"cannot reach"), "{stderr}");
    // -v 2 is the agent's debug output, not its libraries'.
    assert!(stderr.lines().any(|l| l.contains("\"memory allocator arenas\"")), "{stderr}");
    assert!(!stderr.contains("hyper") && !stderr.contains("h2::"), "{stderr}");
}

#[test]
fn a_cipher_suite_the_kubelet_api_cannot_offer_stops_the_agent_before_it_starts() {
    // Standalone with upstream's default authentication, the kubelet API is not served; the
    // suite is refused all the same, before the runtime is even asked for (nobody answers it).
    let (code, stderr) = run_with(&format!("{HEADER}tlsCipherSuites: [TLS_RSA_WITH_RC4_128_SHA]\n"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("failed to construct kubelet dependencies"), "{stderr}");
    assert!(stderr.contains("TLS_RSA_WITH_RC4_128_SHA"), "{stderr}");
    assert!(!stderr.contains("nonexistent"), "the runtime was not asked for: {stderr}");
}

#[test]
fn an_unreadable_manifest_path_is_a_clear_error() {
    // Root reads everything, so an unreadable path is made with a file where a directory's
    // entry is expected: `<file>/x` fails with "not a directory".
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "").unwrap();
    let mut args = scratch(dir.path(), "fake://");
    // The static pod path below a file, in place of the scratch one (the last flag wins).
    args.extend(["--pod-manifest-path".into(), file.join("manifests").into()]);
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs")).arg("run").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot read the static pod path"), "{stderr}");
}

/// The binary as upstream's kubelet is invoked (no subcommand), with the scratch flags of `dir`
/// and `endpoint`, then `args`: exit code, stdout, stderr.
fn kubelet(dir: &Path, endpoint: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
        .args(scratch(dir, endpoint))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn upstreams_invocation_runs_the_agent_and_knows_every_upstream_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, _) = kubelet(dir.path(), NO_RUNTIME, &["--version"]);
    assert_eq!(code, Some(0));
    // kubeadm's preflight reads the version with this pattern.
    let version = stdout.trim().strip_prefix("Kubernetes v").unwrap_or_else(|| panic!("{stdout:?}"));
    let (release, build) = version.split_once('-').unwrap_or_else(|| panic!("{stdout:?}"));
    assert_eq!(release.split('.').filter(|n| n.parse::<u32>().is_ok()).count(), 3, "{stdout:?}");
    assert_eq!(build, concat!("kubelet-rs.", env!("CARGO_PKG_VERSION")), "{stdout:?}");
    let (code, raw, _) = kubelet(dir.path(), NO_RUNTIME, &["--version=raw"]);
    assert!(code == Some(0) && raw.starts_with("version.Info{Major:\"1\""), "{raw}");

    // --help puts upstream's flags under what they do here.
    let (code, help, _) = kubelet(dir.path(), NO_RUNTIME, &["--help"]);
    assert_eq!(code, Some(0));
    // The lines under `heading`, up to the next heading.
    let until_next_heading = |heading: &str| {
        let start = help.find(&format!("\n{heading}")).unwrap_or_else(|| panic!("{heading:?} in:\n{help}"));
        let under = help[start + 1..].lines().skip(1).take_while(|l| l.is_empty() || l.starts_with(' '));
        under.collect::<Vec<_>>().join("\n")
    };
    assert!(until_next_heading("Deprecated upstream").contains("--pod-infra-container-image"), "{help}");
    assert!(until_next_heading("Accepted without effect").contains("--lock-file"), "{help}");
    assert!(until_next_heading("Accepted only at upstream's default").contains("--cgroups-per-qos"), "{help}");
    assert!(until_next_heading("Configuration (each flag").contains("--max-pods"), "{help}");

    let (code, _, stderr) = kubelet(dir.path(), NO_RUNTIME, &["--max-pod=3"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--max-pods"), "the closest flag is suggested: {stderr}");

    // Flags without a subcommand run the agent; flags for missing features are named once, a
    // deprecated one gets upstream's line; the missing runtime then stops it (exit code 1).
    let (code, _, stderr) = kubelet(
        dir.path(),
        NO_RUNTIME,
        &[
            "--node-labels",
            "role=edge",
            "--lock-file",
            "/run/kubelet.lock",
            "--pod-infra-container-image",
            "registry.k8s.io/pause:3.10",
            "--anonymous-auth=false",
            "--max-pods",
            "30",
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "Flag --pod-infra-container-image has been deprecated, will be removed in 1.35. Image garbage collector will get sandbox image information from CRI."
        ),
        "{stderr}"
    );
    assert!(stderr.contains("set but without effect in kubelet-rs: --lock-file"), "{stderr}");
    assert!(stderr.contains("cannot reach the container runtime"), "{stderr}");

    // A flag's value that asks for what the agent lacks stops it with code 2, naming the flag.
    let (code, _, stderr) = kubelet(dir.path(), NO_RUNTIME, &["--cgroups-per-qos=false"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--cgroups-per-qos: field cgroupsPerQOS"), "{stderr}");
}

#[test]
fn a_missing_kubeconfig_without_bootstrap_credentials_stops_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = kubelet(dir.path(), "fake://", &["--kubeconfig", "/nonexistent/kubelet.conf"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot join the cluster with --kubeconfig /nonexistent/kubelet.conf"), "{stderr}");
    assert!(stderr.contains("or --bootstrap-kubeconfig must give credentials"), "{stderr}");

    // A bootstrap kubeconfig needs a kubeconfig to write.
    let (code, _, stderr) = kubelet(dir.path(), "fake://", &["--bootstrap-kubeconfig", "/nonexistent/bootstrap.conf"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--bootstrap-kubeconfig: needs --kubeconfig"), "{stderr}");

    // One that cannot be read stops the bootstrap, saying which.
    let kubeconfig = dir.path().join("kubelet.conf");
    let args = ["--kubeconfig", kubeconfig.to_str().unwrap(), "--bootstrap-kubeconfig", "/nonexistent/bootstrap.conf"];
    let (code, _, stderr) = kubelet(dir.path(), "fake://", &args);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("TLS bootstrap with --bootstrap-kubeconfig failed"), "{stderr}");
    assert!(stderr.contains("cannot use the kubeconfig /nonexistent/bootstrap.conf"), "{stderr}");
    assert!(!kubeconfig.exists());
}

#[test]
fn completions_and_the_man_page_come_from_the_same_command_line() {
    let printed = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs")).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let bash = printed(&["completion", "bash", "--name", "kubelet"]);
    assert!(bash.contains("complete -F _kubelet") && bash.contains("--max-pods"), "{bash}");
    for shell in ["zsh", "fish"] {
        let script = printed(&["completion", shell]);
        assert!(script.contains("max-pods"), "{shell}: {script}");
    }
    let man = printed(&["man"]);
    assert!(man.contains(".TH kubelet-rs 1"), "{man}");
    assert!(man.contains("\\-\\-max\\-pods") && man.contains("The most pods this node runs"), "{man}");
}
