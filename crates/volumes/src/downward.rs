//! downwardAPI volumes (upstream `pkg/volume/downwardapi`): the pod's metadata and its
//! containers' resources as files, written atomically and refreshed on every sync; projected
//! volumes (`api.rs`) write downwardAPI sources with [`files`] too.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use k8s_openapi::{
    api::core::v1::{DownwardAPIVolumeFile, Pod, Volume},
    apimachinery::pkg::api::resource::Quantity,
};
use kubelet_core::{
    hook::BoxFuture,
    resources::resource_field_value,
    volume::{DOWNWARD_API, VolumePlugin},
};

use crate::atomic::{self, File};

/// Files' mode when the volume sets none (upstream `DownwardAPIVolumeSourceDefaultMode`).
const DEFAULT_MODE: i32 = 0o644;

/// The node's allocatable resources, which a `resourceFieldRef` to a limit a container does not
/// set reads (upstream `defaultPodLimitsForDownwardAPI`); shared by the plugins that write
/// downwardAPI files, set with [`crate::Manager::allocatable`].
#[derive(Debug, Default)]
pub(crate) struct Allocatable(RwLock<BTreeMap<String, Quantity>>);

impl Allocatable {
    pub(crate) fn set(&self, allocatable: BTreeMap<String, Quantity>) {
        // Each write replaces the whole map: a poisoned lock holds a whole one.
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = allocatable;
    }

    pub(crate) fn get(&self) -> BTreeMap<String, Quantity> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// downwardAPI volumes.
#[derive(Clone, Debug, Default)]
pub(crate) struct DownwardApi(pub(crate) Arc<Allocatable>);

impl VolumePlugin for DownwardApi {
    fn name(&self) -> &str {
        DOWNWARD_API
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.downward_api.is_some()
    }

    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.downward_api.as_ref().ok_or("not a downwardAPI volume")?;
            let mode = source.default_mode.unwrap_or(DEFAULT_MODE);
            let payload = files(pod, source.items.iter().flatten(), mode, &self.0)?;
            crate::api::write(dir, payload, false, crate::ownership::fs_group(pod)).await
        })
    }

    fn tear_down<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(crate::remove_unmounted(dir))
    }

    fn read_only(&self) -> bool {
        true
    }

    fn relabels(&self) -> bool {
        true
    }
}

/// The files of `items` for `pod`, each with its own mode or `default_mode`.
pub(crate) fn files<'a>(
    pod: &Pod,
    items: impl Iterator<Item = &'a DownwardAPIVolumeFile>,
    default_mode: i32,
    allocatable: &Allocatable,
) -> Result<BTreeMap<String, File>, String> {
    let mut payload = BTreeMap::new();
    for item in items {
        atomic::validate_path(&item.path)?;
        let content = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path)?
        } else if let Some(resource) = &item.resource_field_ref {
            resource_value(pod, resource, &allocatable.get())?
        } else {
            return Err(format!("{:?}: neither fieldRef nor resourceFieldRef", item.path));
        };
        let mode = u32::try_from(item.mode.unwrap_or(default_mode) & 0o777).unwrap_or(0o644);
        payload.insert(item.path.clone(), File::new(content.into_bytes(), mode));
    }
    Ok(payload)
}

/// A `fieldRef` of a downwardAPI volume: the pod's name, namespace, UID, labels and
/// annotations (all, or one by key).
fn field_value(pod: &Pod, path: &str) -> Result<String, String> {
    kubelet_core::types::metadata_field(pod, path)
        .ok_or_else(|| format!("unsupported fieldPath {path:?} in a downwardAPI volume"))
}

/// A `resourceFieldRef`: the named container's request or limit, in units of the divisor,
/// rounded up; an unset CPU or memory limit is the node's allocatable
/// ([`resource_field_value`]).
fn resource_value(
    pod: &Pod,
    selector: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    allocatable: &BTreeMap<String, Quantity>,
) -> Result<String, String> {
    let name = selector.container_name.as_deref().unwrap_or_default();
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let container = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .ok_or_else(|| format!("resourceFieldRef names unknown container {name:?}"))?;
    resource_field_value(container, &selector.resource, selector.divisor.as_ref(), allocatable)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Container, ObjectFieldSelector, PodSpec, ResourceFieldSelector, ResourceRequirements},
        apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
    };

    use super::*;

    fn item(path: &str, field: Option<&str>, resource: Option<(&str, &str)>) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: field.map(|f| ObjectFieldSelector { field_path: f.into(), ..ObjectFieldSelector::default() }),
            resource_field_ref: resource.map(|(c, r)| ResourceFieldSelector {
                container_name: Some(c.into()),
                resource: r.into(),
                divisor: Some(Quantity("1Mi".into())),
            }),
            mode: None,
        }
    }

    #[test]
    fn metadata_and_resources_become_files() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                uid: Some("u1".into()),
                labels: Some(BTreeMap::from([("tier".into(), "front".into()), ("app".into(), "web".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(BTreeMap::from([("memory".into(), Quantity("64Mi".into()))])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let items = [
            item("labels", Some("metadata.labels"), None),
            item("name", Some("metadata.name"), None),
            item("app", Some("metadata.labels['app']"), None),
            item("mem", None, Some(("app", "limits.memory"))),
        ];
        let allocatable = Allocatable::default();
        allocatable.set(BTreeMap::from([("cpu".to_owned(), Quantity("1500m".into()))]));
        let files = files(&pod, items.iter(), 0o600, &allocatable).unwrap();
        let text = |p: &str| String::from_utf8(files[p].content.clone()).unwrap();
        assert_eq!(text("labels"), "app=\"web\"\ntier=\"front\"");
        assert_eq!((text("name").as_str(), text("app").as_str(), text("mem").as_str()), ("web", "web", "64"));
        assert_eq!(files["name"].mode, 0o600);
        let unset = [item("cpu", None, Some(("app", "limits.cpu")))];
        let files = super::files(&pod, unset.iter(), 0o644, &allocatable).unwrap();
        assert_eq!(files["cpu"].content, b"1", "an unset limit is the node's allocatable, 1.5 cores in 1Mi");
        let escape = [item("../x", Some("metadata.name"), None)];
        assert!(super::files(&pod, escape.iter(), 0o644, &allocatable).is_err());
    }
}
