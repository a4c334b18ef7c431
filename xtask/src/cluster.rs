//! `cargo xtask cluster up|down|status`: a real control plane on loopback for the cluster-mode
//! tests: Debian's etcd and upstream's kube-apiserver, the one `cargo xtask setup` built from
//! Debian's source package ([`kube_apiserver`]), or another build `KUBELET_RS_KUBE_APISERVER`
//! names.
//!
//! The API server runs as a cluster's does for its nodes: `--authorization-mode=Node,RBAC` and
//! the NodeRestriction admission plugin. `up` makes a PKI with openssl, an admin kubeconfig, and a
//! kubeconfig per test node (`kubelet-rs-node-N`) holding that node's own client certificate
//! (`system:node:NAME` in `system:nodes`), so the agent under test holds only what a kubelet holds.
//! There is no scheduler and no controller-manager: tests bind pods themselves and make the
//! `default` service account and the `kube-root-ca.crt` config map of their namespaces.

use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    kube_apiserver,
    layout::STATE_DIR,
    runtime::{Daemon, wait_until},
    util::{have, output, run},
};

/// Names the kube-apiserver binary to run.
pub(crate) const ENV_APISERVER: &str = "KUBELET_RS_KUBE_APISERVER";
/// The admin kubeconfig, for tests (`cluster-admin` through `system:masters`).
const ENV_ADMIN: &str = "KUBELET_RS_TEST_KUBECONFIG";
/// The directory of the nodes' kubeconfigs (`<node>.kubeconfig`), for tests.
const ENV_NODES: &str = "KUBELET_RS_TEST_NODE_KUBECONFIGS";
/// Where the kube-apiserver's PID is kept, for tests that stop it.
const ENV_APISERVER_PID_FILE: &str = "KUBELET_RS_TEST_KUBE_APISERVER_PID_FILE";
/// How many test nodes get a certificate: `kubelet-rs-node-0` and on.
const NODES: usize = 4;

const ETCD: Daemon = Daemon::new("etcd", "etcd");
const APISERVER: Daemon = Daemon::new("kube-apiserver", "kube-apiserver");

fn dir() -> PathBuf {
    Path::new(STATE_DIR).join("cluster")
}

fn pki() -> PathBuf {
    dir().join("pki")
}

/// The admin's kubeconfig (`cluster-admin` through `system:masters`).
pub(crate) fn admin_kubeconfig() -> PathBuf {
    dir().join("admin.kubeconfig")
}

fn nodes_dir() -> PathBuf {
    dir().join("nodes")
}

/// The name and kubeconfig of test node `index` (below [`NODES`]), holding its own client
/// certificate.
pub(crate) fn node(index: usize) -> (String, PathBuf) {
    let name = format!("kubelet-rs-node-{index}");
    let kubeconfig = nodes_dir().join(format!("{name}.kubeconfig"));
    (name, kubeconfig)
}

/// Whether etcd and kube-apiserver run.
pub(crate) fn running() -> bool {
    ETCD.running_pid().is_some() && APISERVER.running_pid().is_some()
}

/// The kube-apiserver binary: the one `KUBELET_RS_KUBE_APISERVER` names, or else the one
/// `cargo xtask setup` built.
fn apiserver_binary() -> Result<PathBuf, String> {
    let Some(path) = std::env::var_os(ENV_APISERVER).filter(|p| !p.is_empty()) else {
        let built = kube_apiserver::built_binary();
        if built.is_file() {
            return Ok(built);
        }
        return Err(format!(
            "no kube-apiserver: `cargo xtask setup` builds one into {} (or set {ENV_APISERVER} to another build)",
            built.display()
        ));
    };
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(format!("{ENV_APISERVER}={} is not a file", path.display()));
    }
    Ok(path)
}

/// Why the control plane cannot start here, if it cannot.
pub(crate) fn missing_prerequisites() -> Option<String> {
    if let Err(why) = apiserver_binary() {
        return Some(why);
    }
    let missing: Vec<&str> = ["etcd", "openssl", "curl"].into_iter().filter(|p| !have(p)).collect();
    (!missing.is_empty()).then(|| format!("missing {} (run `cargo xtask setup`)", missing.join(", ")))
}

/// What the tests need to reach the control plane, and to take kube-apiserver away.
pub(crate) fn test_env() -> Vec<(&'static str, String)> {
    vec![
        (ENV_ADMIN, admin_kubeconfig().display().to_string()),
        (ENV_NODES, nodes_dir().display().to_string()),
        (ENV_APISERVER_PID_FILE, APISERVER.pid_file().display().to_string()),
    ]
}

/// A free TCP port on 127.0.0.1 (free when asked; the daemon binds it a moment later).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts etcd and kube-apiserver unless they run; makes the PKI and kubeconfigs first.
pub(crate) fn up() -> Result<()> {
    if let Some(why) = missing_prerequisites() {
        bail!("cannot start the control plane: {why}");
    }
    if let (Some(etcd), Some(apiserver)) = (ETCD.running_pid(), APISERVER.running_pid()) {
        println!("control plane already running (etcd pid {etcd}, kube-apiserver pid {apiserver})");
        return Ok(());
    }
    down()?;
    let dir = dir();
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(pki())?;
    fs::create_dir_all(nodes_dir())?;
    let (client, peer, secure) = (free_port()?, free_port()?, free_port()?);
    make_pki()?;
    let server = format!("https://127.0.0.1:{secure}");
    write_kubeconfig(&admin_kubeconfig(), &server, "admin")?;
    for n in 0..NODES {
        let (node, kubeconfig) = node(n);
        write_kubeconfig(&kubeconfig, &server, &node)?;
    }

    let etcd_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let data = dir.join("etcd");
    mount_etcd_filesystem(&data)?;
    let pid = ETCD.spawn_program(
        Path::new("etcd"),
        &[
            "--name=default",
            &format!("--data-dir={}", data.display()),
            &format!("--listen-client-urls={etcd_url}"),
            &format!("--advertise-client-urls={etcd_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=default={peer_url}"),
        ],
    )?;
    println!("started etcd on {etcd_url} (pid {pid})");

    let pki = pki();
    let file = |name: &str| pki.join(name).display().to_string();
    let apiserver = apiserver_binary().map_err(anyhow::Error::msg)?;
    let mut args = vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--secure-port={secure}"),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
        format!("--client-ca-file={}", file("ca.crt")),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
        format!("--service-account-key-file={}", file("sa.pub")),
        format!("--service-account-signing-key-file={}", file("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        "--authorization-mode=Node,RBAC".to_owned(),
        // Bootstrap tokens, as kubeadm's nodes join with: the TLS bootstrap test makes one.
        "--enable-bootstrap-token-auth".to_owned(),
        "--enable-admission-plugins=NodeRestriction".to_owned(),
        format!("--kubelet-client-certificate={}", file("apiserver-kubelet-client.crt")),
        format!("--kubelet-client-key={}", file("apiserver-kubelet-client.key")),
        "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
        "--endpoint-reconciler-type=none".to_owned(),
        "--allow-privileged=true".to_owned(),
        // `/debug/pprof` for the admin: a goroutine dump shows where a request the server holds
        // waits (README, "Join a cluster").
        "--profiling=true".to_owned(),
    ];
    // `kubectl debug`'s ephemeral containers: alpha before v1.23 (off unless asked for, as a v1.20
    // cluster's admin would ask), GA from v1.25, the gate gone from v1.27 (naming it is an error).
    if minor_version(&apiserver).is_some_and(|minor| minor < 27) {
        args.push("--feature-gates=EphemeralContainers=true".to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let pid = APISERVER.spawn_program(&apiserver, &args)?;
    wait_until("kube-apiserver", Duration::from_secs(60), || ready(&server))
        .with_context(|| format!("see {} and {}", APISERVER.log_file().display(), ETCD.log_file().display()))?;
    println!("started kube-apiserver on {server} (pid {pid}); admin kubeconfig {}", admin_kubeconfig().display());
    Ok(())
}

/// The minor version kube-apiserver `binary` says it is (`Kubernetes v1.20.2`: 20).
fn minor_version(binary: &Path) -> Option<u32> {
    let said = output(Command::new(binary).arg("--version")).ok()?;
    said.trim().strip_prefix("Kubernetes v")?.split('.').nth(1)?.parse().ok()
}

/// Whether the API server answers `/readyz` with 200 to the admin.
fn ready(server: &str) -> bool {
    let pki = pki();
    output(
        Command::new("curl")
            .args(["--silent", "--output", "/dev/null", "--write-out", "%{http_code}", "--max-time", "2"])
            .arg("--cacert")
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .arg(format!("{server}/readyz")),
    )
    .is_ok_and(|code| code.trim() == "200")
}

/// Stops kube-apiserver, then etcd (by the PIDs `up` wrote); etcd's data goes with them.
pub(crate) fn down() -> Result<()> {
    APISERVER.stop()?;
    ETCD.stop()?;
    let data = dir().join("etcd");
    if crate::runtime::is_mount_point(&data) && output(Command::new("umount").arg(&data)).is_err() {
        let _ = output(Command::new("umount").arg("--lazy").arg(&data));
    }
    let _ = fs::remove_dir_all(data);
    Ok(())
}

/// The size of etcd's own filesystem: the tests' objects take a few megabytes.
const ETCD_FS_SIZE: &str = "512m";

/// Mounts a tmpfs of its own on etcd's data directory `data`: its writes then wait for no disk,
/// so the API server answers as fast on a host busy writing (a build beside the tests made a
/// certificate request wait 30 s for etcd's fsync, past the certificate's 20 s lifetime).
fn mount_etcd_filesystem(data: &Path) -> Result<()> {
    fs::create_dir_all(data)?;
    if crate::runtime::is_mount_point(data) {
        return Ok(());
    }
    let options = format!("size={ETCD_FS_SIZE},mode=0700");
    run(Command::new("mount").args(["-t", "tmpfs", "-o", &options, "tmpfs"]).arg(data))
        .with_context(|| format!("cannot mount etcd's own filesystem on {}", data.display()))
}

/// Prints what runs.
pub(crate) fn status() -> Result<()> {
    if let Some(why) = missing_prerequisites() {
        println!("prerequisites: {why}");
    }
    for daemon in [&ETCD, &APISERVER] {
        match daemon.running_pid() {
            Some(pid) => println!("{}: running (pid {pid}), log {}", daemon.name(), daemon.log_file().display()),
            None => println!("{}: not running", daemon.name()),
        }
    }
    if admin_kubeconfig().is_file() {
        println!("admin kubeconfig: {}", admin_kubeconfig().display());
        println!("node kubeconfigs: {}/kubelet-rs-node-{{0..{}}}.kubeconfig", nodes_dir().display(), NODES - 1);
    }
    Ok(())
}

/// The CA, the API server's serving and kubelet-client certificates, the service-account key
/// pair, the admin's certificate and each test node's.
fn make_pki() -> Result<()> {
    let pki = pki();
    let openssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(&pki));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=kubelet-rs-test-ca",
    ])?;
    openssl(&["genrsa", "-out", "sa.key", "2048"])?;
    openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    leaf("apiserver", "/CN=kube-apiserver", "serverAuth", Some("IP:127.0.0.1,DNS:localhost"))?;
    leaf("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth", None)?;
    leaf("admin", "/O=system:masters/CN=kubelet-rs-admin", "clientAuth", None)?;
    for n in 0..NODES {
        let (node, _) = node(n);
        leaf(&node, &format!("/O=system:nodes/CN=system:node:{node}"), "clientAuth", None)?;
    }
    Ok(())
}

/// A key and a certificate signed by the CA: `<name>.key`, `<name>.crt`.
fn leaf(name: &str, subject: &str, usage: &str, alt_names: Option<&str>) -> Result<()> {
    let pki = pki();
    let extensions = pki.join(format!("{name}.ext"));
    let mut text = format!("keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n");
    if let Some(names) = alt_names {
        text.push_str(&format!("subjectAltName={names}\n"));
    }
    fs::write(&extensions, text)?;
    let (key, csr, crt) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"));
    let openssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(&pki));
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject])?;
    let ext = extensions.display().to_string();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-out",
        &crt,
        "-extfile",
        &ext,
    ])
}

/// A kubeconfig for `user` (`admin`, or a node's name) with file paths into the PKI, as a
/// kubeadm node's `/etc/kubernetes/kubelet.conf` has them.
fn write_kubeconfig(path: &Path, server: &str, user: &str) -> Result<()> {
    let pki = pki();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    \
         client-key: {key}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {user}}}\n\
         current-context: test\n",
        ca = pki.join("ca.crt").display(),
        crt = pki.join(format!("{user}.crt")).display(),
        key = pki.join(format!("{user}.key")).display(),
    );
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
