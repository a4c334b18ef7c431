//! The manager on a scratch directory: set up, refresh and tear down each volume type.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        ConfigMapVolumeSource, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
        HostPathVolumeSource, ObjectFieldSelector,
    },
    apimachinery::pkg::api::resource::Quantity,
};

use super::*;

fn pod(volumes: Vec<Volume>) -> Pod {
    let mut pod = kubelet_core::testing::pod("u1", &[]);
    pod.metadata.name = Some("web".into());
    pod.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    pod.spec.as_mut().unwrap().volumes = Some(volumes);
    pod
}

fn labels_volume() -> Volume {
    Volume {
        name: "info".into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: "labels".into(),
                field_ref: Some(ObjectFieldSelector { field_path: "metadata.labels".into(), ..Default::default() }),
                ..DownwardAPIVolumeFile::default()
            }]),
            ..DownwardAPIVolumeSource::default()
        }),
        ..Volume::default()
    }
}

#[tokio::test]
async fn volumes_are_set_up_refreshed_and_torn_down() {
    let scratch = tempfile::tempdir().unwrap();
    let pods = scratch.path().join("pods");
    let host = scratch.path().join("host/data");
    let manager = Manager::new(&pods);
    let mut pod = pod(vec![
        Volume { name: "cache".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
        Volume {
            name: "data".into(),
            host_path: Some(HostPathVolumeSource {
                path: host.display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Volume::default()
        },
        labels_volume(),
    ]);
    let volumes = manager.mount_pod(&pod).await.unwrap();
    let cache = pods.join("u1/volumes/kubernetes.io~empty-dir/cache");
    assert_eq!(volumes.get("cache"), Some(cache.as_path()));
    assert!(cache.is_dir());
    assert_eq!(volumes.get("data"), Some(host.as_path()));
    assert!(host.is_dir(), "DirectoryOrCreate made the host directory");
    let info = pods.join("u1/volumes/kubernetes.io~downward-api/info");
    assert_eq!(std::fs::read_to_string(info.join("labels")).unwrap(), "app=\"web\"");
    // Containers write emptyDir and hostPath volumes as their mounts say; the agent's own
    // downward API files they only read.
    assert!(!volumes.is_read_only("cache") && !volumes.is_read_only("data"));
    assert!(volumes.is_read_only("info"));

    // A second sync keeps the emptyDir's content and refreshes the labels.
    std::fs::write(cache.join("kept"), "x").unwrap();
    pod.metadata.labels = Some(BTreeMap::from([("app".into(), "api".into())]));
    manager.mount_pod(&pod).await.unwrap();
    assert!(cache.join("kept").exists());
    assert_eq!(std::fs::read_to_string(info.join("labels")).unwrap(), "app=\"api\"");

    manager.unmount_pod(&PodUid::new("u1")).await.unwrap();
    assert!(!pods.join("u1/volumes").exists(), "every volume directory is gone");
    assert!(host.is_dir(), "the host's directory stays");
}

#[tokio::test]
async fn volumes_that_need_the_api_server_or_fail_their_check_are_errors() {
    let scratch = tempfile::tempdir().unwrap();
    let manager = Manager::new(scratch.path());
    let config_map =
        Volume { name: "cfg".into(), config_map: Some(ConfigMapVolumeSource::default()), ..Volume::default() };
    assert!(!manager.supports(&config_map));
    let err = manager.mount_pod(&pod(vec![config_map])).await.unwrap_err();
    assert_eq!(err, VolumeError::Unsupported { volume: "cfg".into() });
    let missing = Volume {
        name: "data".into(),
        host_path: Some(HostPathVolumeSource {
            path: scratch.path().join("nope").display().to_string(),
            type_: Some("Directory".into()),
        }),
        ..Volume::default()
    };
    let err = manager.mount_pod(&pod(vec![missing])).await.unwrap_err().to_string();
    assert!(err.contains("hostPath type check failed") && err.contains("is not a directory"), "{err}");
}

#[tokio::test]
async fn a_memory_empty_dir_is_a_tmpfs_of_its_size_limit() {
    let scratch = tempfile::tempdir().unwrap();
    let manager = Manager::new(scratch.path());
    let memory = Volume {
        name: "shm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity("16Mi".into())),
        }),
        ..Volume::default()
    };
    let pod = pod(vec![memory]);
    let volumes = match manager.mount_pod(&pod).await {
        Ok(volumes) => volumes,
        Err(err) if !is_root() => {
            kubelet_core::testing::skip(
                "a_memory_empty_dir_is_a_tmpfs_of_its_size_limit",
                &format!("mounting needs root ({err})"),
            );
            return;
        }
        Err(err) => panic!("{err}"),
    };
    let dir = volumes.get("shm").unwrap().to_owned();
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = table.lines().find(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap())).expect("mounted");
    assert!(line.contains(" - tmpfs ") && line.contains("size=16384k"), "{line}");
    // Setting up again does not mount twice.
    manager.mount_pod(&pod).await.unwrap();
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_eq!(table.lines().filter(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap())).count(), 1);
    manager.unmount_pod(&PodUid::new("u1")).await.unwrap();
    assert!(!dir.exists());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(dir.to_str().unwrap()), "unmounted");
}

pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

/// Objects as an API server would hand them, changeable by the test.
#[derive(Default)]
struct Objects {
    config_maps: std::sync::Mutex<BTreeMap<String, kubelet_core::volume::ObjectData>>,
    tokens: std::sync::atomic::AtomicU32,
}

impl ObjectSource for Objects {
    fn config_map<'a>(
        &'a self,
        pod: &'a Pod,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<kubelet_core::volume::ObjectData>, String>> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let found = self.config_maps.lock().unwrap().get(&format!("{namespace}/{name}")).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn config_map_text<'a>(
        &'a self,
        _pod: &'a Pod,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>> {
        Box::pin(async { Err("volumes read no config map as text".to_owned()) })
    }

    fn secret<'a>(
        &'a self,
        _pod: &'a Pod,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<kubelet_core::volume::ObjectData>, String>> {
        let found = (name == "db").then(|| BTreeMap::from([("password".to_owned(), b"hunter2".to_vec())]));
        Box::pin(async move { Ok(found) })
    }

    fn service_account_token<'a>(
        &'a self,
        pod: &'a Pod,
        audience: Option<&'a str>,
        expiration_seconds: i64,
    ) -> BoxFuture<'a, Result<String, String>> {
        let n = self.tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = pod.metadata.name.clone().unwrap_or_default();
        Box::pin(async move { Ok(format!("token-{n}-{name}-{}-{expiration_seconds}", audience.unwrap_or("api"))) })
    }
}

fn key(key: &str, path: &str, mode: Option<i32>) -> k8s_openapi::api::core::v1::KeyToPath {
    k8s_openapi::api::core::v1::KeyToPath { key: key.into(), path: path.into(), mode }
}

#[tokio::test]
async fn config_map_secret_and_projected_volumes_come_from_the_object_source_and_follow_it() {
    use std::os::unix::fs::PermissionsExt;

    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, DownwardAPIProjection, ProjectedVolumeSource, SecretVolumeSource,
        ServiceAccountTokenProjection, VolumeProjection,
    };
    if !is_root() {
        kubelet_core::testing::skip(
            "config_map_secret_and_projected_volumes_come_from_the_object_source_and_follow_it",
            "secret and projected volumes mount a tmpfs (root)",
        );
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let pods = scratch.path().join("pods");
    let objects = Arc::new(Objects::default());
    objects.config_maps.lock().unwrap().insert(
        "default/app".into(),
        BTreeMap::from([("greeting".into(), b"hello".to_vec()), ("other".into(), b"x".to_vec())]),
    );
    objects
        .config_maps
        .lock()
        .unwrap()
        .insert("default/kube-root-ca.crt".into(), BTreeMap::from([("ca.crt".into(), b"CA".to_vec())]));
    let manager = Manager::new(&pods).objects(objects.clone());
    let config = Volume {
        name: "cfg".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: "app".into(),
            items: Some(vec![key("greeting", "dir/hello.txt", Some(0o600))]),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    };
    let secret = Volume {
        name: "creds".into(),
        secret: Some(SecretVolumeSource { secret_name: Some("db".into()), ..SecretVolumeSource::default() }),
        ..Volume::default()
    };
    let access = Volume {
        name: "kube-api-access-x".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(3607),
                        audience: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![key("ca.crt", "ca.crt", None)]),
                        optional: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".into(),
                                ..Default::default()
                            }),
                            ..DownwardAPIVolumeFile::default()
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mut pod = pod(vec![config, secret, access]);
    pod.metadata.namespace = Some("default".into());
    let volumes = manager.mount_pod(&pod).await.unwrap();
    let cfg = volumes.get("cfg").unwrap().to_owned();
    assert_eq!(cfg, pods.join("u1/volumes/kubernetes.io~configmap/cfg"));
    assert_eq!(std::fs::read_to_string(cfg.join("dir/hello.txt")).unwrap(), "hello");
    assert!(!cfg.join("other").exists(), "only the items asked for");
    let mode = std::fs::metadata(cfg.join("dir/hello.txt")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let creds = volumes.get("creds").unwrap();
    assert_eq!(std::fs::read_to_string(creds.join("password")).unwrap(), "hunter2");
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(table.contains(&format!(" {} ", creds.display())), "a secret volume is a tmpfs");
    let access = volumes.get("kube-api-access-x").unwrap();
    assert_eq!(std::fs::read_to_string(access.join("token")).unwrap(), "token-0-web-api-3607");
    assert_eq!(std::fs::read_to_string(access.join("ca.crt")).unwrap(), "CA");
    assert_eq!(std::fs::read_to_string(access.join("namespace")).unwrap(), "default");
    // The token keeps the volume's mode (0644 by default), so a container of any user reads it.
    let token_mode = std::fs::metadata(access.join("token")).unwrap().permissions().mode() & 0o777;
    assert_eq!(token_mode, 0o644);
    // The agent writes all three: every container mounts them read-only.
    for name in ["cfg", "creds", "kube-api-access-x"] {
        assert!(volumes.is_read_only(name), "{name} is mounted read-only");
    }

    // A change of the config map reaches the file at the next set-up.
    objects.config_maps.lock().unwrap().get_mut("default/app").unwrap().insert("greeting".into(), b"bye".to_vec());
    manager.mount_pod(&pod).await.unwrap();
    assert_eq!(std::fs::read_to_string(cfg.join("dir/hello.txt")).unwrap(), "bye");

    // With an fsGroup (and one runAsUser for every container): the group owns every file, which
    // gains its read, and the token is that user's, 0640.
    {
        use std::os::unix::fs::MetadataExt;
        let mut owned = pod.clone();
        owned.metadata.uid = Some("u2".into());
        let spec = owned.spec.as_mut().unwrap();
        spec.containers = vec![k8s_openapi::api::core::v1::Container { name: "app".into(), ..Default::default() }];
        spec.security_context = Some(k8s_openapi::api::core::v1::PodSecurityContext {
            fs_group: Some(2000),
            run_as_user: Some(1000),
            ..Default::default()
        });
        let volumes = manager.mount_pod(&owned).await.unwrap();
        let owner = |volume: &str, file: &str| {
            let meta = std::fs::metadata(volumes.get(volume).unwrap().join(file)).unwrap();
            (meta.uid(), meta.gid(), meta.mode() & 0o7777)
        };
        assert_eq!(owner("cfg", "dir/hello.txt"), (0, 2000, 0o640), "0600 and the group's read");
        assert_eq!(owner("cfg", "dir"), (0, 2000, 0o2755));
        assert_eq!(owner("creds", "password"), (0, 2000, 0o644));
        assert_eq!(owner("kube-api-access-x", "token"), (1000, 2000, 0o640), "the token is its user's");
        assert_eq!(owner("kube-api-access-x", "ca.crt"), (0, 2000, 0o644));
        manager.unmount_pod(&PodUid::new("u2")).await.unwrap();
    }

    // A missing config map is an error in upstream's words, unless optional; a missing key too.
    objects.config_maps.lock().unwrap().remove("default/app");
    let err = manager.mount_pod(&pod).await.unwrap_err().to_string();
    assert!(err.contains("configmap \"app\" not found in namespace \"default\""), "{err}");

    manager.unmount_pod(&PodUid::new("u1")).await.unwrap();
    assert!(!pods.join("u1/volumes").exists());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(&creds.display().to_string()), "the tmpfs is unmounted");
}
