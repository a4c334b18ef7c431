//! `kubelet-rs run --config`: a file the agent cannot use stops it before it starts, with exit
//! code 2 and a message naming the file, the field and the line. No runtime needed.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

fn run_with(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubelet.yaml");
    std::fs::write(&file, config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
        .args(["run", "--config"])
        .arg(&file)
        .args(["--container-runtime-endpoint", "unix:///nonexistent/cri.sock", "--root-dir"])
        .arg(dir.path().join("root"))
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
