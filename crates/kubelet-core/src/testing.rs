//! Support for tests against a real runtime (feature `test-util`).
//!
//! `cargo xtask ci` starts the project's containerd and passes its endpoint and test images to
//! the tests through the environment.
//! [`RealRuntime::from_env`] reads them; when they are absent it prints what was skipped and why,
//! except under CI (`CI=true`), where a missing real runtime is a failure.
//! By convention, real-runtime test functions are named `real_*`: `cargo xtask ci` runs them in a
//! step of their own, after the runtime is up.
//! A test that cannot run here says so with [`skip`], which fails it under CI; a part of a test
//! that this machine or server cannot check is named with [`not_checked`], which CI's summary
//! lists.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

/// Environment variable: the CRI endpoint, e.g. `unix:///run/kubelet-rs-dev/containerd.sock`.
pub const ENV_ENDPOINT: &str = "KUBELET_RS_CRI_ENDPOINT";
/// Environment variable: a busybox image the runtime can pull.
pub const ENV_BUSYBOX: &str = "KUBELET_RS_TEST_BUSYBOX";
/// Environment variable: the sandbox (pause) image.
pub const ENV_PAUSE: &str = "KUBELET_RS_TEST_PAUSE";
/// Environment variable: a scratch directory for pod log directories and the like.
pub const ENV_DIR: &str = "KUBELET_RS_TEST_DIR";
/// Environment variable: the file [`not_checked`] appends its lines to, which `cargo xtask ci`
/// names in its summary.
pub const ENV_NOT_CHECKED: &str = "KUBELET_RS_TEST_NOT_CHECKED";

/// Whether the tests run under CI (`CI=true` or `CI=1`), where no test may skip itself.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Says that `test` skipped itself, and why.
///
/// # Panics
///
/// Under CI ([`in_ci`]): a test CI names must run there.
pub fn skip(test: &str, why: &str) {
    assert!(!in_ci(), "{test}: CI=true but the test cannot run here: {why}");
    eprintln!("SKIPPED {test}: {why}");
}

/// Says that `test` did not check `what`, and why (a server older than the behaviour, a machine
/// without the hardware): printed, and appended as a line to the file [`ENV_NOT_CHECKED`] names,
/// whose lines `cargo xtask ci` lists in its summary. The rest of the test runs as usual.
pub fn not_checked(test: &str, what: &str, why: &str) {
    use std::io::Write;
    let line = format!("{test}: {what} ({why})");
    eprintln!("NOT CHECKED {line}");
    let Some(path) = std::env::var_os(ENV_NOT_CHECKED).filter(|p| !p.is_empty()) else { return };
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    // Reason: a line CI cannot record would hide what it did not check.
    assert!(appended.is_ok(), "{test}: cannot record what it did not check in {path:?}: {appended:?}");
}

/// The real runtime a test may use.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RealRuntime {
    /// The CRI endpoint.
    pub endpoint: String,
    /// A busybox image reference.
    pub busybox_image: String,
    /// The sandbox image reference.
    pub pause_image: String,
    /// A scratch directory the test may write to.
    pub scratch_dir: PathBuf,
}

impl RealRuntime {
    /// The real runtime from the environment, or `None` (after saying so) when there is none.
    ///
    /// # Panics
    ///
    /// Under CI (`CI=true`) when the environment names no runtime: CI must never skip these tests.
    pub fn from_env(test: &str) -> Option<RealRuntime> {
        let var = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
        match (var(ENV_ENDPOINT), var(ENV_BUSYBOX), var(ENV_PAUSE), var(ENV_DIR)) {
            (Some(endpoint), Some(busybox_image), Some(pause_image), Some(dir)) => {
                Some(RealRuntime { endpoint, busybox_image, pause_image, scratch_dir: PathBuf::from(dir) })
            }
            _ => {
                let why = format!("{ENV_ENDPOINT}, {ENV_BUSYBOX}, {ENV_PAUSE} and {ENV_DIR} are not all set");
                skip(test, &format!("no real runtime ({why}); `cargo xtask ci` as root runs it"));
                None
            }
        }
    }

    /// An image in the same registry repository as busybox that no pod runs (`cargo xtask`
    /// pushes `unused:2.0`, 64 MiB of random bytes, there and never imports it), for a test to pull
    /// and remove.
    pub fn unused_image(&self) -> String {
        let repository = self.busybox_image.rsplit_once('/').map_or("", |(repository, _)| repository);
        format!("{repository}/unused:2.0")
    }

    /// The stand-in for kubeadm's control-plane images, in the same registry repository as
    /// busybox and imported into the runtime by `cargo xtask`: busybox with `openssl` and a
    /// script run as `etcd`, `kube-apiserver`, `kube-controller-manager` and `kube-scheduler`
    /// that reports what its pod gave it and answers the component's probes.
    pub fn control_plane_image(&self) -> String {
        let repository = self.busybox_image.rsplit_once('/').map_or("", |(repository, _)| repository);
        format!("{repository}/control-plane-stand-in:1.0")
    }

    /// A pod with one busybox container `app` that sleeps for an hour, named `name` in
    /// `namespace`, with a UID no other run of the test shares.
    pub fn sleeping_pod(&self, name: &str, namespace: &str) -> Pod {
        use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                uid: Some(format!("{name}-{}-{nanos}", std::process::id())),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some(self.busybox_image.clone()),
                    image_pull_policy: Some("IfNotPresent".into()),
                    command: Some(vec!["sleep".into(), "3600".into()]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }
}

/// A pod for unit tests: name and UID `uid` in `default`, a 30 s grace period, and one busybox
/// container per name in `containers`.
pub fn pod(uid: &str, containers: &[&str]) -> Pod {
    use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(uid.into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(30),
            containers: containers
                .iter()
                .map(|n| Container { name: (*n).into(), image: Some("busybox".into()), ..Container::default() })
                .collect(),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// Pod workers for tests of what feeds them: every update is recorded, and the queries answer
/// from `known` (a pod there is known and may have running containers; nothing is terminating
/// or terminated).
#[derive(Default)]
pub struct RecordingWorkers {
    /// The updates asked for, oldest first.
    pub updates: std::sync::Mutex<Vec<crate::UpdatePodOptions>>,
    /// The workers `sync_known_pods` reports.
    pub known: std::sync::Mutex<std::collections::HashMap<crate::PodUid, crate::WorkerSync>>,
    /// What `lifecycle_generation` answers (`None`, the default: housekeeping walks every time).
    pub lifecycle: std::sync::Mutex<Option<u64>>,
    /// How many times `sync_known_pods` was called: once for each walk of housekeeping's.
    pub known_syncs: std::sync::atomic::AtomicUsize,
}

impl RecordingWorkers {
    /// The updates asked for since the last call, oldest first.
    pub fn take_updates(&self) -> Vec<crate::UpdatePodOptions> {
        std::mem::take(&mut *crate::util::lock(&self.updates))
    }

    /// Reports a worker for `uid`.
    pub fn know(&self, uid: crate::PodUid, sync: crate::WorkerSync) {
        crate::util::lock(&self.known).insert(uid, sync);
    }
}

impl crate::PodWorkers for RecordingWorkers {
    fn update_pod(&self, options: crate::UpdatePodOptions) {
        crate::util::lock(&self.updates).push(options);
    }
    fn sync_known_pods(
        &self,
        _desired: &[std::sync::Arc<Pod>],
    ) -> std::collections::HashMap<crate::PodUid, crate::WorkerSync> {
        self.known_syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        crate::util::lock(&self.known).clone()
    }
    fn lifecycle_generation(&self) -> Option<u64> {
        *crate::util::lock(&self.lifecycle)
    }
    fn is_pod_known(&self, uid: &crate::PodUid) -> bool {
        crate::util::lock(&self.known).contains_key(uid)
    }
    fn is_pod_known_terminated(&self, _: &crate::PodUid) -> bool {
        false
    }
    fn could_have_running_containers(&self, _: &crate::PodUid) -> bool {
        true
    }
    fn is_pod_termination_requested(&self, _: &crate::PodUid) -> bool {
        false
    }
    fn should_pod_containers_be_terminating(&self, _: &crate::PodUid) -> bool {
        false
    }
    fn should_pod_runtime_be_removed(&self, _: &crate::PodUid) -> bool {
        false
    }
    fn should_pod_content_be_removed(&self, _: &crate::PodUid) -> bool {
        false
    }
}

/// The environment variable proptest reads its seed from.
pub const ENV_PROPTEST_SEED: &str = "PROPTEST_RNG_SEED";

/// A seed for a property test's `ProptestConfig::rng_seed`: `PROPTEST_RNG_SEED` when it is set,
/// else a fresh one. It is printed, so a failing run (whose output the test harness shows) says
/// how to replay it: `PROPTEST_RNG_SEED=<seed> cargo test <name>`.
pub fn proptest_seed(test: &str) -> u64 {
    let seed = std::env::var(ENV_PROPTEST_SEED).ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(now.as_nanos() & u128::from(u64::MAX)).unwrap_or(0)
            ^ u64::from(std::process::id()).rotate_left(32)
    });
    eprintln!("{test}: proptest seed {seed}; replay with {ENV_PROPTEST_SEED}={seed}");
    seed
}
