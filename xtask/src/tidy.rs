//! `cargo xtask tidy`: project rules no compiler checks.
//!
//! - every `.rs` file starts with a `//!` line;
//! - internal dependencies: the root pins them with path and exact version, members use
//!   `workspace = true`, kubelet-core depends on no sibling, siblings not on each other, and
//!   only `crates/bin` may name concrete implementations;
//! - kubelet-core depends only on crates that do no IO, and enables none of tokio's IO features;
//! - only `crates/bin` selects a k8s-openapi version feature in `[dependencies]`, and the version
//!   agrees between `crates/bin`, the dev-dependencies and `.cargo/config.toml`;
//! - every `#[ignore]` carries a reason;
//! - `unsafe` is allowed in two places only: the binary's allocator module (its arena bound and
//!   trim) and kubelet-cni's namespaces (joining one between fork and exec);
//! - every histogram a crate records has its bucket layout in `kubelet_core::metrics::HISTOGRAMS`,
//!   so the exporter never falls back to a summary;
//! - a runtime manager made in a test or benchmark names its pod log, container log and per-pod
//!   directories, so it never writes to the host's `/var/log/pods` or `/var/lib/kubelet/pods`.
//!
//! It also runs as a plain `#[test]`, so `cargo test` catches the same problems.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

use crate::util::project_root;

/// Library crates and the internal crates each may depend on: core at the bottom, every other
/// library on core alone, so a pod's path visits no crate twice.
const LIBRARIES: [(&str, &[&str]); 11] = [
    ("crates/kubelet-core", &[]),
    ("crates/pleg", &["kubelet-core"]),
    ("crates/podworkers", &["kubelet-core"]),
    ("crates/cri-client", &["kubelet-core"]),
    ("crates/cni", &["kubelet-core"]),
    ("crates/config", &["kubelet-core"]),
    ("crates/kubelet", &["kubelet-core"]),
    ("crates/prober", &["kubelet-core"]),
    ("crates/volumes", &["kubelet-core"]),
    ("crates/apiserver", &["kubelet-core"]),
    // The facade: one dependency for downstream agents, over the libraries it re-exports.
    (
        "crates/sdk",
        &[
            "kubelet-core",
            "kubelet",
            "config",
            "pleg",
            "podworkers",
            "cri-client",
            "cni",
            "kubelet-cluster",
            "server",
            "prober",
            "volumes",
        ],
    ),
];
const INTERNAL: [&str; 10] = [
    "kubelet-core",
    "pleg",
    "podworkers",
    "cri-client",
    "cni",
    "config",
    "kubelet",
    "prober",
    "volumes",
    "kubelet-cluster",
];

/// The only third-party crates kubelet-core may depend on: none of them does IO.
const CORE_DEPENDENCIES: [&str; 8] =
    ["k8s-openapi", "tokio", "tokio-util", "tracing", "thiserror", "metrics", "dashmap", "fastrand"];
/// tokio features that do IO, which kubelet-core must not enable.
const TOKIO_IO_FEATURES: [&str; 6] = ["\"fs\"", "\"net\"", "\"process\"", "\"io-util\"", "\"signal\"", "\"full\""];

pub(crate) fn run_tidy() -> Result<()> {
    let root = project_root()?;
    let mut problems = Vec::new();
    check_rust_files(&root, &mut problems)?;
    check_manifests(&root, &mut problems)?;
    if problems.is_empty() {
        println!("tidy: ok");
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("tidy found {} problem(s)", problems.len())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if !path.ends_with("target") {
                rust_files(&path, out)?;
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

fn check_rust_files(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files)?;
    rust_files(&root.join("xtask"), &mut files)?;
    let layouts = fs::read_to_string(root.join("crates/kubelet-core/src/metrics.rs"))?;
    for file in files {
        let text = fs::read_to_string(&file)?;
        let rel = file.strip_prefix(root).unwrap_or(&file).display().to_string();
        // Generated code (the CRI bindings) follows its generator's rules, not the project's.
        if text.lines().take(10).any(|line| line.contains("@generated")) {
            continue;
        }
        if rel.contains("/tests/") || rel.contains("/benches/") {
            for statement in manager_configs(&text) {
                if let Some(missing) = MANAGER_DIRS.iter().find(|dir| !statement.contains(*dir)) {
                    problems.push(format!(
                        "{rel}: a test's manager::Config without {missing}...): it would write to the host"
                    ));
                }
            }
        }
        for name in histograms(&text) {
            if !layouts.contains(&format!("(\"{name}\", &")) {
                problems
                    .push(format!("{rel}: histogram {name} has no bucket layout in kubelet_core::metrics::HISTOGRAMS"));
            }
        }
        if !text.lines().find(|l| !l.trim().is_empty()).is_some_and(|l| l.starts_with("//!")) {
            problems.push(format!("{rel}: must start with a `//!` line saying what the file is"));
        }
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            // Built with concat! so this file does not flag itself.
            if line.starts_with(concat!("#[", "ignore]")) {
                problems.push(format!("{rel}:{}: `#[ignore]` needs a reason: #[ignore = \"...\"]", n + 1));
            }
            if line.contains(concat!("allow(", "unsafe_code)")) && !UNSAFE_FILES.contains(&rel.as_str()) {
                problems.push(format!("{rel}:{}: `unsafe` is allowed only in {}", n + 1, UNSAFE_FILES.join(" and ")));
            }
        }
    }
    Ok(())
}

/// The files that may allow `unsafe` code (workspace lint `unsafe_code = "deny"`).
const UNSAFE_FILES: [&str; 2] = ["crates/bin/src/alloc.rs", "crates/cni/src/netns.rs"];

/// The directories a runtime manager writes to, each of which a test must name.
const MANAGER_DIRS: [&str; 3] = [".pod_logs_dir(", ".container_logs_dir(", ".pods_dir("];

/// Each statement of a source file that makes a runtime manager's configuration, from the call to
/// the end of the statement.
fn manager_configs(text: &str) -> Vec<&str> {
    // Built with concat! so this file does not make one itself.
    let call = concat!("manager::Config", "::new(");
    text.match_indices(call).map(|(at, _)| text[at..].split(';').next().unwrap_or_default()).collect()
}

/// The names of the histograms a source file records (the first argument of each `histogram!`).
fn histograms(text: &str) -> Vec<&str> {
    // Built with concat! so this file does not record one itself.
    let call = concat!("histogram", "!(\"");
    text.match_indices(call).filter_map(|(at, _)| text[at + call.len()..].split('"').next()).collect()
}

/// The `[dependencies]` section of a manifest, as (name, line) pairs.
fn dependencies(manifest: &str) -> Vec<(String, String)> {
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_deps = trimmed == "[dependencies]";
            continue;
        }
        if in_deps && !trimmed.is_empty() && !trimmed.starts_with('#') {
            let name = trimmed.split(['=', '.', ' ']).next().unwrap_or_default().to_owned();
            deps.push((name, trimmed.to_owned()));
        }
    }
    deps
}

fn check_manifests(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let workspace = fs::read_to_string(root.join("Cargo.toml"))?;
    let version = workspace
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.trim().strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    for name in INTERNAL {
        let pinned = workspace.lines().any(|l| {
            l.starts_with(&format!("{name} = "))
                && l.contains("path = ")
                && l.contains(&format!("version = \"={version}\""))
        });
        if !pinned {
            problems.push(format!(
                "Cargo.toml: internal crate `{name}` must be pinned with path and version \"={version}\""
            ));
        }
    }

    for (dir, allowed) in LIBRARIES {
        let manifest = fs::read_to_string(root.join(dir).join("Cargo.toml"))?;
        for (name, line) in dependencies(&manifest) {
            if INTERNAL.contains(&name.as_str()) {
                if !allowed.contains(&name.as_str()) {
                    problems.push(format!(
                        "{dir}/Cargo.toml: must not depend on `{name}` (only crates/bin wires implementations)"
                    ));
                }
                if !line.contains("workspace = true") && !line.contains(".workspace = true") {
                    problems
                        .push(format!("{dir}/Cargo.toml: internal dependency `{name}` must use `workspace = true`"));
                }
            }
            if name == "k8s-openapi" && line.contains("v1_") {
                problems.push(format!("{dir}/Cargo.toml: libraries must not select a k8s-openapi version feature"));
            }
            if name == "anyhow" {
                problems.push(format!("{dir}/Cargo.toml: libraries use thiserror, not anyhow"));
            }
        }
    }

    let core = fs::read_to_string(root.join("crates/kubelet-core/Cargo.toml"))?;
    for (name, line) in dependencies(&core) {
        if !INTERNAL.contains(&name.as_str()) && !CORE_DEPENDENCIES.contains(&name.as_str()) {
            problems.push(format!(
                "crates/kubelet-core/Cargo.toml: `{name}` is not one of the IO-free crates core may use ({})",
                CORE_DEPENDENCIES.join(", ")
            ));
        }
        if name == "tokio" && TOKIO_IO_FEATURES.iter().any(|f| line.contains(f)) {
            problems
                .push(format!("crates/kubelet-core/Cargo.toml: core must not enable tokio's IO features: `{line}`"));
        }
    }

    let config = fs::read_to_string(root.join(".cargo/config.toml"))?;
    let env_version = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("K8S_OPENAPI_ENABLED_VERSION = "))
        .map(|v| v.trim_matches('"').replace('.', "_"))
        .unwrap_or_default();
    let feature = format!("\"v{env_version}\"");
    for dir in LIBRARIES.iter().map(|(dir, _)| *dir).chain(["crates/bin"]) {
        let manifest = fs::read_to_string(root.join(dir).join("Cargo.toml"))?;
        let uses = manifest.lines().filter(|l| l.starts_with("k8s-openapi") && l.contains("v1_"));
        for line in uses {
            if !line.contains(&feature) {
                problems.push(format!(
                    "{dir}/Cargo.toml: k8s-openapi feature in `{line}` disagrees with K8S_OPENAPI_ENABLED_VERSION (v{env_version})"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tidy() {
        super::run_tidy().unwrap();
    }

    #[test]
    fn histogram_names_are_found() {
        let text = concat!(
            "metrics::",
            "histogram!(\"a_seconds\").record(1.0);\n",
            "metrics::",
            "histogram!(\"b\", \"l\" => v)"
        );
        assert_eq!(super::histograms(text), ["a_seconds", "b"]);
    }

    #[test]
    fn a_test_manager_config_must_name_its_directories() {
        let good =
            concat!("let c = manager::Config", "::new(\"n\").pod_logs_dir(a).container_logs_dir(b).pods_dir(c);");
        let bad = concat!("let c = manager::Config", "::new(\"n\").pod_logs_dir(a);");
        for (text, missing) in [(good, None), (bad, Some(".container_logs_dir("))] {
            let statement = super::manager_configs(text)[0];
            assert_eq!(super::MANAGER_DIRS.iter().find(|d| !statement.contains(*d)).copied(), missing);
        }
    }

    #[test]
    fn dependencies_section_is_parsed() {
        let deps = super::dependencies(
            "[package]\nname = \"x\"\n[dependencies]\nkubelet-core.workspace = true\ntokio = { workspace = true }\n[dev-dependencies]\npleg.workspace = true\n",
        );
        let names: Vec<_> = deps.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["kubelet-core", "tokio"]);
    }
}
