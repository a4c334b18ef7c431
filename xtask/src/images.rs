//! The test images, built here with no internet: a static `pause`, a busybox image, a one-file
//! image no pod runs, for the image garbage collection test to pull and remove, and a stand-in
//! for kubeadm's control-plane images (busybox with the host's `openssl`), for the test that runs
//! kubeadm's static pod manifests.
//!
//! Each image is written as an OCI image layout by hand (one gzip layer made with reproducible
//! `tar` and `gzip -n`, a config, a manifest and `index.json`), so the same inputs give the same
//! digests on every machine with the same Debian packages.
//! `load` imports them into the test containerd's `k8s.io` namespace and pushes them to the
//! local registry.

use std::{
    fs,
    io::{self, Read},
    os::unix::fs::{PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use serde_json::json;

use crate::{
    layout::{REGISTRY, STATE_DIR},
    util::{output, project_root, run, sha256},
};

/// The repository (under the local registry) of the test images.
const REPOSITORY: &str = "kubelet-rs";

/// One test image.
pub(crate) struct Image {
    pub(crate) name: &'static str,
    pub(crate) tag: &'static str,
}

/// The static pause image, used as the sandbox image.
pub(crate) const PAUSE: Image = Image { name: "pause", tag: "1.0" };
/// The busybox image, for test containers.
pub(crate) const BUSYBOX: Image = Image { name: "busybox", tag: "1.35" };
/// busybox, the host's `openssl` and `control-plane-stand-in.sh` as etcd, kube-apiserver,
/// kube-controller-manager and kube-scheduler.
pub(crate) const CONTROL_PLANE: Image = Image { name: "control-plane-stand-in", tag: "1.0" };
/// An image that no pod runs: only in the registry, for image GC and the eviction manager to
/// remove. Its one file is [`UNUSED_MIB`] of random bytes, so that pulling it moves the usage of
/// the runtime's 4 GiB image filesystem by whole percents (upstream's image GC thresholds are
/// whole percents) and a test can place a threshold between the usage before and after.
pub(crate) const UNUSED: Image = Image { name: "unused", tag: "2.0" };

/// The size of the unused image's file: held twice on the image filesystem once pulled (the
/// compressed layer, which random bytes do not shrink, and its unpacked snapshot), about 3 %.
const UNUSED_MIB: u64 = 64;

impl Image {
    /// The full reference in the local registry.
    pub(crate) fn reference(&self) -> String {
        format!("{REGISTRY}/{REPOSITORY}/{}:{}", self.name, self.tag)
    }

    fn layout_dir(&self) -> PathBuf {
        images_dir().join(format!("{}-{}.oci", self.name, self.tag))
    }

    fn archive(&self) -> PathBuf {
        images_dir().join(format!("{}-{}.oci.tar", self.name, self.tag))
    }
}

fn images_dir() -> PathBuf {
    Path::new(STATE_DIR).join("images")
}

/// Whether every image archive exists.
pub(crate) fn built() -> bool {
    [PAUSE, BUSYBOX, CONTROL_PLANE, UNUSED].iter().all(|i| i.archive().is_file())
}

/// Builds the images and prints their manifest digests.
pub(crate) fn build() -> Result<()> {
    let build_dir = images_dir().join("build");
    if build_dir.exists() {
        fs::remove_dir_all(&build_dir)?;
    }
    fs::create_dir_all(&build_dir)?;

    let pause_root = build_dir.join("pause-rootfs");
    fs::create_dir_all(&pause_root)?;
    let source = project_root()?.join("xtask/images/pause.c");
    run(Command::new("gcc").args(["-static", "-O2", "-Wall", "-o"]).arg(pause_root.join("pause")).arg(&source))?;
    run(Command::new("strip").arg(pause_root.join("pause")))?;
    let digest = write_image(&PAUSE, &pause_root, &build_dir, json!({ "Entrypoint": ["/pause"] }))?;
    println!("built {} ({digest})", PAUSE.reference());

    let busybox_root = build_dir.join("busybox-rootfs");
    busybox_rootfs(&busybox_root)?;
    let config = json!({ "Cmd": ["sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/" });
    let digest = write_image(&BUSYBOX, &busybox_root, &build_dir, config)?;
    println!("built {} ({digest})", BUSYBOX.reference());

    let control_plane_root = build_dir.join("control-plane-rootfs");
    control_plane_rootfs(&control_plane_root)?;
    let config = json!({ "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/" });
    let digest = write_image(&CONTROL_PLANE, &control_plane_root, &build_dir, config)?;
    println!("built {} ({digest})", CONTROL_PLANE.reference());

    let unused_root = build_dir.join("unused-rootfs");
    fs::create_dir_all(&unused_root)?;
    let mut random = fs::File::open("/dev/urandom")?.take(UNUSED_MIB * 1024 * 1024);
    io::copy(&mut random, &mut fs::File::create(unused_root.join("unused"))?)?;
    let digest = write_image(&UNUSED, &unused_root, &build_dir, json!({ "Cmd": ["/unused"] }))?;
    println!("built {} ({digest})", UNUSED.reference());

    fs::remove_dir_all(&build_dir)?;
    Ok(())
}

fn busybox_rootfs(root: &Path) -> Result<()> {
    for dir in ["bin", "etc", "tmp", "root", "var/www", "dev", "proc", "sys"] {
        fs::create_dir_all(root.join(dir))?;
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    fs::copy("/bin/busybox", root.join("bin/busybox")).context("copying /bin/busybox (package busybox-static)")?;
    let applets = output(Command::new("/bin/busybox").arg("--list"))?;
    for applet in applets.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        symlink("busybox", root.join("bin").join(applet))?;
    }
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    fs::write(root.join("var/www/index.html"), "<h1>kubelet-rs test page</h1>\n")?;
    Ok(())
}

/// busybox's root with `/usr/bin/openssl` and the libraries it loads, and the stand-in script
/// under each control-plane component's name.
fn control_plane_rootfs(root: &Path) -> Result<()> {
    busybox_rootfs(root)?;
    copy_with_libraries(Path::new("/usr/bin/openssl"), root)?;
    let bin = root.join("usr/local/bin");
    fs::create_dir_all(&bin)?;
    let script = bin.join("control-plane-stand-in");
    fs::copy(project_root()?.join("xtask/images/control-plane-stand-in.sh"), &script)?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    for component in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
        symlink("control-plane-stand-in", bin.join(component))?;
    }
    Ok(())
}

/// Copies `binary` and the shared libraries `ldd` says it loads into `root` at their paths.
fn copy_with_libraries(binary: &Path, root: &Path) -> Result<()> {
    let listing = output(Command::new("ldd").arg(binary)).with_context(|| format!("ldd {}", binary.display()))?;
    // Lines are `libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x...)` or
    // `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no file.
    let libraries = listing.lines().filter_map(|line| line.split_whitespace().find(|word| word.starts_with('/')));
    for file in std::iter::once(binary).chain(libraries.map(Path::new)) {
        let target = root.join(file.strip_prefix("/")?);
        fs::create_dir_all(target.parent().context("a file in a directory")?)?;
        fs::copy(file, &target).with_context(|| format!("copying {}", file.display()))?;
    }
    Ok(())
}

/// A reproducible tar of `dir`'s content into `out`.
fn reproducible_tar(dir: &Path, out: &Path) -> Result<()> {
    run(Command::new("tar")
        .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "--format=gnu", "-C"])
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg("."))
}

/// Writes a blob into the layout and returns its descriptor fields (digest, size).
fn add_blob(layout: &Path, file: &Path) -> Result<(String, u64)> {
    let hex = sha256(file)?;
    let size = fs::metadata(file)?.len();
    fs::copy(file, layout.join("blobs/sha256").join(&hex))?;
    Ok((format!("sha256:{hex}"), size))
}

fn write_json_blob(layout: &Path, scratch: &Path, value: &serde_json::Value) -> Result<(String, u64)> {
    let file = scratch.join("blob.json");
    fs::write(&file, serde_json::to_vec(value)?)?;
    add_blob(layout, &file)
}

fn architecture() -> Result<&'static str> {
    Ok(match output(Command::new("uname").arg("-m"))?.trim() {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => anyhow::bail!("unsupported architecture {other}"),
    })
}

/// Writes the OCI layout and archive of `image` from `rootfs`; returns the manifest digest.
fn write_image(image: &Image, rootfs: &Path, scratch: &Path, config: serde_json::Value) -> Result<String> {
    let layout = image.layout_dir();
    if layout.exists() {
        fs::remove_dir_all(&layout)?;
    }
    fs::create_dir_all(layout.join("blobs/sha256"))?;
    fs::set_permissions(rootfs, fs::Permissions::from_mode(0o755))?;

    let layer_tar = scratch.join(format!("{}-layer.tar", image.name));
    reproducible_tar(rootfs, &layer_tar)?;
    let diff_id = format!("sha256:{}", sha256(&layer_tar)?);
    run(Command::new("gzip").args(["-n", "-9", "-f"]).arg(&layer_tar))?;
    let (layer_digest, layer_size) = add_blob(&layout, &scratch.join(format!("{}-layer.tar.gz", image.name)))?;

    let config = json!({
        "architecture": architecture()?,
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
    });
    let (config_digest, config_size) = write_json_blob(&layout, scratch, &config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": layer_size }],
    });
    let (manifest_digest, manifest_size) = write_json_blob(&layout, scratch, &manifest)?;
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "annotations": {
                "io.containerd.image.name": image.reference(),
                "org.opencontainers.image.ref.name": image.tag,
            },
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    fs::write(layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    reproducible_tar(&layout, &image.archive())?;
    Ok(manifest_digest)
}

/// Imports the images pods run into containerd (namespace `k8s.io`) and pushes every image to
/// the registry.
pub(crate) fn load(containerd_socket: &Path) -> Result<()> {
    import(containerd_socket)?;
    push()
}

/// Imports every image pods run into the containerd at `containerd_socket` (namespace `k8s.io`).
pub(crate) fn import(containerd_socket: &Path) -> Result<()> {
    for image in [PAUSE, BUSYBOX, CONTROL_PLANE] {
        output(
            Command::new("ctr")
                .arg("--address")
                .arg(containerd_socket)
                .args(["-n", "k8s.io", "images", "import"])
                .arg(image.archive()),
        )
        .with_context(|| format!("importing {}", image.reference()))?;
        println!("imported {} into {}", image.reference(), containerd_socket.display());
    }
    Ok(())
}

/// Pushes every image, [`UNUSED`] too (only pulled), into the registry.
pub(crate) fn push() -> Result<()> {
    for image in [PAUSE, BUSYBOX, CONTROL_PLANE, UNUSED] {
        output(
            Command::new("skopeo")
                .args(["copy", "--quiet", "--dest-tls-verify=false"])
                .arg(format!("oci:{}:{}", image.layout_dir().display(), image.tag))
                .arg(format!("docker://{}", image.reference())),
        )
        .with_context(|| format!("pushing {}", image.reference()))?;
        println!("pushed {} into the registry", image.reference());
    }
    Ok(())
}
