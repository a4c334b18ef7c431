//! CI's `package` step: the libraries as crates.io gets them.
//!
//! `cargo package` makes each library's tarball (without cargo's own verification, which builds
//! each one apart, with its own feature set, so every dependency is compiled a dozen times);
//! then the tarballs are unpacked side by side into a workspace of their own, each library's
//! dependencies on the others patched to the unpacked copies, and checked together once
//! (`cargo check`, in the target directory of the steps before, with the repository's profiles,
//! so that it reuses their dependencies: what a tarball can lack fails a check as it fails a
//! build).
//! A file a tarball leaves out, a path dependency without a version, or a build script that
//! reaches outside its package fails that check as it would fail on crates.io.
//! A downstream crate is checked with them: the example agent (`crates/sdk/examples/process_agent.rs`)
//! as a crate of its own that depends on `kubelet-sdk` from crates.io (its own `Runtime`, pods
//! networked through the CNI seam), as a user's agent would.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    ci::cargo,
    util::{project_root, run},
};

/// The workspace's packages that are not published: the binary and this tool.
const UNPUBLISHED: [&str; 2] = ["kubelet-rs", "xtask"];

/// Packages the libraries and checks them from their tarballs.
pub(crate) fn check() -> Result<()> {
    let root = project_root()?;
    let packages_dir = root.join("target/package");
    forget_old_tarballs(&packages_dir)?;
    let mut package = cargo();
    package.args(["package", "--workspace", "--locked", "--no-verify"]);
    for name in UNPUBLISHED {
        package.args(["--exclude", name]);
    }
    run(&mut package)?;

    let workspace = packages_dir.join("from-tarballs");
    if workspace.exists() {
        fs::remove_dir_all(&workspace)?;
    }
    fs::create_dir_all(&workspace)?;
    let mut unpacked = unpack_tarballs(&packages_dir, &workspace)?;
    write_downstream_agent(&root, &workspace)?;
    unpacked.push(Unpacked { name: String::new(), dir: DOWNSTREAM.to_owned() });
    let profiles = profile_tables(&fs::read_to_string(root.join("Cargo.toml"))?);
    fs::write(workspace.join("Cargo.toml"), workspace_manifest(&unpacked) + "\n" + &profiles)?;
    // The versions the repository tested, where the tarballs' own manifests allow them.
    fs::copy(root.join("Cargo.lock"), workspace.join("Cargo.lock"))?;
    run(cargo()
        .current_dir(&workspace)
        .args(["check", "--workspace", "--offline"])
        .env("CARGO_TARGET_DIR", root.join("target")))
}

/// The downstream crate's directory in the workspace of tarballs.
const DOWNSTREAM: &str = "downstream-agent";

/// The downstream crate: the example agent's source, depending on `kubelet-sdk` as published.
fn write_downstream_agent(root: &Path, workspace: &Path) -> Result<()> {
    let dir = workspace.join(DOWNSTREAM);
    fs::create_dir_all(dir.join("src"))?;
    fs::copy(root.join("crates/sdk/examples/process_agent.rs"), dir.join("src/main.rs"))?;
    // The versions come from the lock file the workspace copies; k8s-openapi needs the one API
    // version feature an agent picks.
    let manifest = "[package]\nname = \"downstream-agent\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
                    [dependencies]\nkubelet-sdk = { version = \"0.1.0\", features = [\"cni\"] }\n\
                    k8s-openapi = { version = \"*\", features = [\"v1_36\"] }\n\
                    tokio = { version = \"1\", features = [\"macros\", \"rt-multi-thread\", \"process\", \"sync\"] }\n";
    fs::write(dir.join("Cargo.toml"), manifest)?;
    Ok(())
}

/// Removes the tarballs an earlier run left (of crates since renamed or removed, too), so that only
/// this run's are built.
fn forget_old_tarballs(packages_dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(packages_dir) else { return Ok(()) };
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "crate") {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// One library unpacked from its tarball: its name and its directory under the workspace.
struct Unpacked {
    name: String,
    dir: String,
}

/// Unpacks the libraries' tarballs (`<name>-<version>.crate`) of this run into `workspace`.
fn unpack_tarballs(packages_dir: &Path, workspace: &Path) -> Result<Vec<Unpacked>> {
    let mut unpacked = Vec::new();
    for entry in fs::read_dir(packages_dir)? {
        let path = entry?.path();
        let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".crate")) else {
            continue;
        };
        let Some((name, _version)) = stem.rsplit_once('-') else { continue };
        if UNPUBLISHED.contains(&name) {
            continue;
        }
        // `-m`: the files get the time of unpacking, not the tarball's, or cargo would take an
        // earlier build of the same version for fresh.
        run(Command::new("tar").arg("-xzmf").arg(&path).arg("-C").arg(workspace))
            .with_context(|| format!("unpacking {}", path.display()))?;
        unpacked.push(Unpacked { name: name.to_owned(), dir: stem.to_owned() });
    }
    if unpacked.is_empty() {
        bail!("cargo package left no tarball in {}", packages_dir.display());
    }
    unpacked.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(unpacked)
}

/// A workspace of the unpacked libraries (and the downstream crate, which has no name to patch),
/// each one's dependencies on the others (which name crates.io, as published manifests do)
/// patched to the unpacked copies.
fn workspace_manifest(unpacked: &[Unpacked]) -> String {
    let members: Vec<String> = unpacked.iter().map(|u| format!("{:?}", u.dir)).collect();
    let mut manifest =
        format!("[workspace]\nresolver = \"2\"\nmembers = [{}]\n\n[patch.crates-io]\n", members.join(", "));
    for library in unpacked.iter().filter(|u| !u.name.is_empty()) {
        manifest.push_str(&format!("{} = {{ path = {:?} }}\n", library.name, library.dir));
    }
    manifest
}

/// The `[profile.*]` tables of the repository's manifest, as they are written there.
///
/// The workspace of tarballs builds with the repository's profiles so that its dependencies are
/// the ones the steps before checked: a unit's profile is part of its identity, and with cargo's
/// default profile every dependency was checked again (150 CPU-seconds against 50).
fn profile_tables(manifest: &str) -> String {
    let mut tables = String::new();
    let mut in_profile = false;
    for line in manifest.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            in_profile = trimmed.starts_with("[profile.");
        }
        if in_profile && !trimmed.starts_with('#') {
            tables.push_str(line);
            tables.push('\n');
        }
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_takes_the_repositorys_profiles() {
        let manifest = "[workspace]\nmembers = [\"a\"]\n\n[profile.dev]\ndebug = \"line-tables-only\"\n\n\
                        # What ships.\n[profile.dev.package.\"*\"]\ndebug = false\n[workspace.lints.rust]\nx = 1\n";
        assert_eq!(
            profile_tables(manifest),
            "[profile.dev]\ndebug = \"line-tables-only\"\n\n[profile.dev.package.\"*\"]\ndebug = false\n"
        );
    }

    fn unpacked(name: &str, dir: &str) -> Unpacked {
        Unpacked { name: name.to_owned(), dir: dir.to_owned() }
    }

    #[test]
    fn the_workspace_patches_each_library_to_its_unpacked_copy() {
        let manifest = workspace_manifest(&[
            unpacked("kubelet-cni", "kubelet-cni-0.1.0"),
            unpacked("kubelet-core", "kubelet-core-0.1.0"),
        ]);
        assert_eq!(
            manifest,
            "[workspace]\nresolver = \"2\"\nmembers = [\"kubelet-cni-0.1.0\", \"kubelet-core-0.1.0\"]\n\n\
             [patch.crates-io]\nkubelet-cni = { path = \"kubelet-cni-0.1.0\" }\n\
             kubelet-core = { path = \"kubelet-core-0.1.0\" }\n"
        );
    }
}
