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
            println!("SKIPPED a_memory_empty_dir_is_a_tmpfs_of_its_size_limit: mounting needs root ({err})");
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

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}
