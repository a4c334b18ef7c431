//! The kube-apiserver the cluster-mode tests run against: built once per machine by `cargo xtask
//! setup` from Debian's source package `kubernetes` (upstream's v1.20.2 tree with its `vendor/`,
//! a package like any other), and kept outside the clone, under [`STATE_DIR`].
//!
//! No package registry ships a kube-apiserver binary and none is committed, so the build is
//! the one way every machine of the project, CI's among them, has one. It takes about five
//! minutes on two cores: `apt-get source kubernetes` with a `deb-src` entry for the Debian
//! mirror the machine already uses, Debian's `golang-go`, and the tree's own
//! `make WHAT=cmd/kube-apiserver`. The source and the Go build cache are removed afterwards; the
//! binary and the source package's version stay.
//!
//! `KUBELET_RS_KUBE_APISERVER` still picks another build (a newer one, built by hand).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{
    layout::STATE_DIR,
    util::{output, run},
};

/// The Debian source package the binary is built from.
const SOURCE_PACKAGE: &str = "kubernetes";

/// What the build needs beyond the source: Go, and what the tree's `make` and `apt-get source`
/// call.
const BUILD_PACKAGES: [&str; 3] = ["golang-go", "rsync", "dpkg-dev"];

/// The `deb-src` entries setup adds, next to the machine's own `deb` entries.
const SOURCES_FILE: &str = "/etc/apt/sources.list.d/kubelet-rs-deb-src.sources";

/// Where the built binary and its version are kept.
fn dir() -> PathBuf {
    Path::new(STATE_DIR).join("kube-apiserver")
}

/// The kube-apiserver `cargo xtask setup` built.
pub(crate) fn built_binary() -> PathBuf {
    dir().join("kube-apiserver")
}

/// The version of the source package the kept binary was built from.
fn version_file() -> PathBuf {
    dir().join("SOURCE_VERSION")
}

/// The kept binary's own `--version` (`Kubernetes v1.20.2`), if it runs.
pub(crate) fn built_version() -> Option<String> {
    let binary = built_binary();
    if !binary.is_file() {
        return None;
    }
    output(Command::new(&binary).arg("--version")).ok().map(|v| v.trim().to_owned())
}

/// Builds kube-apiserver from Debian's source package unless a working build is kept already.
pub(crate) fn ensure_built() -> Result<()> {
    if let Some(version) = built_version() {
        println!("kube-apiserver: present ({version}, {})", built_binary().display());
        return Ok(());
    }
    println!(
        "kube-apiserver: building it from Debian's source package `{SOURCE_PACKAGE}` (about 5 minutes on 2 cores)"
    );
    add_source_entries()?;
    install_build_packages()?;
    let work = Path::new(STATE_DIR).join("kube-apiserver-build");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let built = build_in(&work);
    // The tree and the Go build cache take gigabytes; only the binary is kept.
    let _ = fs::remove_dir_all(&work);
    let version = built?;
    println!("kube-apiserver: built {} from {SOURCE_PACKAGE} {version}", built_version().unwrap_or_default());
    Ok(())
}

/// Unpacks the source package in `work`, builds kube-apiserver there and keeps the binary;
/// returns the source package's version.
fn build_in(work: &Path) -> Result<String> {
    run(Command::new("apt-get").args(["source", "-q", SOURCE_PACKAGE]).current_dir(work))?;
    let tree = unpacked_tree(work)?;
    let version = tree
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix(&format!("{SOURCE_PACKAGE}-")))
        .context("the unpacked source's directory names no version")?
        .to_owned();
    // As the package's own rules build it: no cgo, a HOME of its own; the Go cache in `work`.
    run(Command::new("make")
        .arg("WHAT=cmd/kube-apiserver")
        .current_dir(&tree)
        .env("CGO_ENABLED", "0")
        .env("HOME", work)
        .env("GOCACHE", work.join("go-cache"))
        .env("GOPATH", work.join("go")))?;
    let binary = tree.join("_output/bin/kube-apiserver");
    if !binary.is_file() {
        bail!("the build made no {}", binary.display());
    }
    fs::create_dir_all(dir())?;
    // Copied beside its final name and renamed: an interrupted copy is never taken for a build.
    let partial = dir().join("kube-apiserver.partial");
    fs::copy(&binary, &partial).with_context(|| format!("copying {}", binary.display()))?;
    fs::rename(&partial, built_binary())?;
    fs::write(version_file(), format!("{version}\n"))?;
    Ok(version)
}

/// The one directory `apt-get source` unpacked in `work`.
fn unpacked_tree(work: &Path) -> Result<PathBuf> {
    let mut trees = Vec::new();
    for entry in fs::read_dir(work)? {
        let path = entry?.path();
        let named = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(SOURCE_PACKAGE));
        if named && path.is_dir() {
            trees.push(path);
        }
    }
    match trees.as_slice() {
        [tree] => Ok(tree.clone()),
        _ => bail!("apt-get source left {} source trees in {}, not one", trees.len(), work.display()),
    }
}

/// Adds `deb-src` entries for the Debian mirror this machine's `deb` entries name, unless apt
/// already knows the source package.
fn add_source_entries() -> Result<()> {
    if source_known() {
        return Ok(());
    }
    let mut entries = String::new();
    for stanza in debian_deb_stanzas()? {
        entries.push_str(&stanza.replacen("Types: deb", "Types: deb-src", 1));
        entries.push_str("\n\n");
    }
    if entries.is_empty() {
        bail!("no Debian `deb` entry in /etc/apt/sources.list.d/*.sources to add a `deb-src` entry beside");
    }
    println!("apt: adding the Debian mirror's source entries ({SOURCES_FILE})");
    fs::write(SOURCES_FILE, entries)?;
    run(Command::new("apt-get").args(["update", "-q"]))?;
    if !source_known() {
        bail!("apt knows no source package `{SOURCE_PACKAGE}` even with {SOURCES_FILE}");
    }
    Ok(())
}

/// Whether apt knows the source package.
fn source_known() -> bool {
    output(Command::new("apt-cache").args(["showsrc", SOURCE_PACKAGE])).is_ok_and(|out| !out.trim().is_empty())
}

/// The deb822 stanzas of the machine's sources that are Debian's binary entries (`Types: deb`,
/// with Debian's archive keyring or URIs).
fn debian_deb_stanzas() -> Result<Vec<String>> {
    let mut stanzas = Vec::new();
    for entry in fs::read_dir("/etc/apt/sources.list.d")? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "sources") || path == Path::new(SOURCES_FILE) {
            continue;
        }
        let text = fs::read_to_string(&path)?;
        stanzas.extend(deb_stanzas_of_debian(&text));
    }
    Ok(stanzas)
}

/// The stanzas of a deb822 sources file that are `Types: deb` entries of Debian's archives (its
/// security archive too, where a fixed source package would come from), without their comments.
fn deb_stanzas_of_debian(text: &str) -> Vec<String> {
    text.split("\n\n")
        .map(|stanza| stanza.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n"))
        .filter(|stanza| stanza.lines().any(|l| l.trim() == "Types: deb"))
        // Debian's own archives, by their keyring: a vendor's repository for Debian has no
        // source indices, and a `deb-src` entry for it would fail `apt-get update`.
        .filter(|stanza| stanza.contains("debian-archive-keyring"))
        .collect()
}

fn install_build_packages() -> Result<()> {
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(BUILD_PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_entries_copy_debians_binary_entries() {
        let sources = "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
                       Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                       Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\
                       Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                       Types: deb\nURIs: https://vendor.example/node\nSuites: nodistro\n\n\
                       Types: deb\nURIs: https://vendor.example/linux/debian\nSuites: bookworm\n\
                       Signed-By: /usr/share/keyrings/vendor.gpg\n";
        let stanzas = deb_stanzas_of_debian(sources);
        assert_eq!(stanzas.len(), 2, "the mirror and its security archive, not the vendor's: {stanzas:?}");
        assert!(stanzas[0].starts_with("Types: deb\nURIs: http://mirror.example/debian\n"), "{stanzas:?}");
        assert!(!stanzas[0].contains('#'), "comments are left out: {stanzas:?}");
    }
}
