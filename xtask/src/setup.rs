//! `cargo xtask setup`: installs what builds and tests need on Debian and the cargo tools CI runs,
//! builds the test images, and builds the kube-apiserver of the cluster-mode tests once per
//! machine ([`kube_apiserver`]); the demo uses it without the cargo tools and kube-apiserver.
//!
//! Idempotent: installs only missing packages and says what it did.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{
    images, kube_apiserver, runtime,
    util::{have, is_root, output, run},
};

/// Debian packages: the runtime, CNI plugins (and ping, which the CNI
/// tests use to reach a pod address), registry tools,
/// the C toolchain and busybox for the test images, and the control plane's etcd and tools.
const PACKAGES: [&str; 17] = [
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "docker-registry",
    "skopeo",
    "iproute2",
    "iptables",
    "iputils-ping",
    "gcc",
    "libc6-dev",
    "binutils",
    // The control plane of `cargo xtask cluster`: etcd, and openssl and curl for its PKI and
    // readiness check (kube-apiserver itself is built from source, see the README).
    "etcd-server",
    "openssl",
    "curl",
    // kubelet-cluster's `openssl-tls` feature, which CI's feature combinations build.
    "libssl-dev",
    "pkg-config",
];

/// Cargo subcommands `cargo xtask ci` runs, installed from crates.io when missing.
const CARGO_TOOLS: [(&str, &str); 3] = [("cargo-hack", "0.6.46"), ("cargo-deny", "0.20.2"), ("cargo-deb", "3.8.0")];

fn install_cargo_tools() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    for (tool, version) in CARGO_TOOLS {
        if have(tool) {
            println!("{tool}: present");
            continue;
        }
        println!("{tool}: installing {version} from crates.io");
        run(Command::new(&cargo).args(["install", "--locked", "--version", version, tool]))?;
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|s| s.contains("install ok installed"))
}

/// `cargo xtask setup`: the Debian packages, the cargo tools CI runs, the test images and
/// kube-apiserver.
pub(crate) fn run_setup() -> Result<()> {
    install_packages()?;
    install_kubectl()?;
    install_cargo_tools()?;
    build_images()?;
    kube_apiserver::ensure_built()?;
    println!("setup done: start the test runtime with `cargo xtask runtime start`, or run `cargo xtask ci`");
    Ok(())
}

/// What the demo needs of setup: the Debian packages and the test images, without the cargo
/// tools only CI runs (building them from crates.io takes minutes on a fresh machine).
pub(crate) fn setup_for_demo() -> Result<()> {
    install_packages()?;
    build_images()
}

fn install_packages() -> Result<()> {
    if !is_root() {
        bail!("setup installs Debian packages and builds images under {}; run it as root", crate::layout::STATE_DIR);
    }
    if !have("apt-get") || !have("dpkg-query") {
        bail!("setup needs a Debian machine (apt-get and dpkg-query)");
    }
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        println!("packages: all {} present", PACKAGES.len());
        return Ok(());
    }
    println!("packages: installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// kubectl, which the cluster-mode tests drive `kubectl exec` and `kubectl logs` with: Debian's
/// `kubernetes-client` unless the machine has a kubectl already.
fn install_kubectl() -> Result<()> {
    if have("kubectl") {
        println!("kubectl: present");
        return Ok(());
    }
    println!("kubectl: installing Debian's kubernetes-client");
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends", "kubernetes-client"])
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn build_images() -> Result<()> {
    images::build()?;
    if runtime::containerd_running() {
        images::load(&runtime::socket())?;
    }
    Ok(())
}
