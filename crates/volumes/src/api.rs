//! The volumes that need the API server (upstream `pkg/volume/configmap`, `secret`, and
//! `projected`, whose downwardAPI sources need it not): their content comes from an [`ObjectSource`] and is written
//! atomically at every sync, so a change of the object reaches the files at the pod's next
//! sync. Secret and projected volumes live on a tmpfs, as upstream's, so no secret touches the
//! disk.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{KeyToPath, Pod, Volume, VolumeProjection};
use kubelet_core::{
    hook::BoxFuture,
    volume::{CONFIG_MAP, ObjectData, ObjectSource, PROJECTED, SECRET, VolumePlugin},
};

use crate::{
    atomic::{self, File, Group},
    downward, mount, ownership,
};

/// Files' mode when the volume sets none (upstream's default for all four).
const DEFAULT_MODE: i32 = 0o644;
/// A service account token's lifetime when the projection sets none (upstream's 1 h).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;

fn mode_of(mode: i32) -> u32 {
    u32::try_from(mode & 0o777).unwrap_or(0o644)
}

/// The files of `data` as `items` select them (all keys when there are none), each with its
/// own mode or `default_mode`; `what` names the object for errors.
fn select(
    data: &ObjectData,
    items: Option<&Vec<KeyToPath>>,
    default_mode: i32,
    what: &str,
    optional: bool,
) -> Result<BTreeMap<String, File>, String> {
    let mut files = BTreeMap::new();
    match items {
        None => {
            for (key, bytes) in data {
                atomic::validate_path(key)?;
                files.insert(key.clone(), File::new(bytes.clone(), mode_of(default_mode)));
            }
        }
        Some(items) => {
            for item in items {
                atomic::validate_path(&item.path)?;
                let Some(bytes) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("configuration error: {what} has no key {:?}", item.key));
                };
                let mode = mode_of(item.mode.unwrap_or(default_mode));
                files.insert(item.path.clone(), File::new(bytes.clone(), mode));
            }
        }
    }
    Ok(files)
}

/// The object's data, or nothing when it is missing and optional; a missing required one is an
/// error in upstream's words.
fn required(
    data: Option<ObjectData>,
    kind: &str,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<ObjectData, String> {
    match data {
        Some(data) => Ok(data),
        None if optional => Ok(ObjectData::new()),
        None => Err(format!("{kind} \"{name}\" not found in namespace \"{namespace}\"")),
    }
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Writes `payload` into `dir` atomically (on a tmpfs mounted there first when `tmpfs`),
/// everything given to `group`.
pub(crate) async fn write(
    dir: &Path,
    payload: BTreeMap<String, File>,
    tmpfs: bool,
    group: Group,
) -> Result<PathBuf, String> {
    tokio::fs::create_dir_all(dir).await.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if tmpfs && !mount::is_mount_point(dir).await? {
        mount::tmpfs(dir, None).await?;
    }
    let target = dir.to_owned();
    let stamp = kubelet_core::clock::wall_now().strftime("%Y_%m_%d_%H_%M_%S.%f").to_string();
    tokio::task::spawn_blocking(move || atomic::write(&target, &payload, &stamp, group))
        .await
        .map_err(|e| format!("the writer failed: {e}"))??;
    Ok(dir.to_owned())
}

async fn tear_down(dir: &Path) -> Result<(), String> {
    if mount::is_mount_point(dir).await? {
        mount::unmount(dir).await?;
    }
    crate::remove_unmounted(dir).await
}

/// configMap volumes.
pub(crate) struct ConfigMap(pub(crate) Arc<dyn ObjectSource>);

impl VolumePlugin for ConfigMap {
    fn name(&self) -> &str {
        CONFIG_MAP
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.config_map.is_some()
    }

    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.config_map.as_ref().ok_or("not a configMap volume")?;
            let (ns, optional) = (namespace(pod), source.optional.unwrap_or(false));
            let data = self.0.config_map(pod, &source.name).await?;
            let data = required(data, "configmap", ns, &source.name, optional)?;
            let what = format!("configmap {:?}", source.name);
            let files =
                select(&data, source.items.as_ref(), source.default_mode.unwrap_or(DEFAULT_MODE), &what, optional)?;
            write(dir, files, false, ownership::fs_group(pod)).await
        })
    }

    fn tear_down<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(tear_down(dir))
    }

    fn read_only(&self) -> bool {
        true
    }

    fn relabels(&self) -> bool {
        true
    }
}

/// secret volumes, on a tmpfs.
pub(crate) struct Secret(pub(crate) Arc<dyn ObjectSource>);

impl VolumePlugin for Secret {
    fn name(&self) -> &str {
        SECRET
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.secret.as_ref().is_some_and(|s| s.secret_name.is_some())
    }

    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.secret.as_ref().ok_or("not a secret volume")?;
            let name = source.secret_name.as_deref().unwrap_or_default();
            let (ns, optional) = (namespace(pod), source.optional.unwrap_or(false));
            let data = required(self.0.secret(pod, name).await?, "secret", ns, name, optional)?;
            let what = format!("secret {name:?}");
            let files =
                select(&data, source.items.as_ref(), source.default_mode.unwrap_or(DEFAULT_MODE), &what, optional)?;
            write(dir, files, true, ownership::fs_group(pod)).await
        })
    }

    fn tear_down<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(tear_down(dir))
    }

    fn read_only(&self) -> bool {
        true
    }

    fn relabels(&self) -> bool {
        true
    }
}

/// Projected volumes: with an object source, of any of configMap, secret, downwardAPI and
/// serviceAccountToken sources, on a tmpfs; without one, of downwardAPI sources alone, on disk.
pub(crate) struct Projected(pub(crate) Option<Arc<dyn ObjectSource>>, pub(crate) Arc<downward::Allocatable>);

impl Projected {
    /// Whether this plugin writes `source`.
    fn projectable(&self, source: &VolumeProjection) -> bool {
        let needs_api =
            source.config_map.is_some() || source.secret.is_some() || source.service_account_token.is_some();
        source.cluster_trust_bundle.is_none() && source.pod_certificate.is_none() && (self.0.is_some() || !needs_api)
    }

    fn objects(&self) -> Result<&Arc<dyn ObjectSource>, String> {
        self.0.as_ref().ok_or_else(|| "this projection needs the API server".to_owned())
    }
}

impl Projected {
    async fn files(&self, pod: &Pod, source: &VolumeProjection, mode: i32) -> Result<BTreeMap<String, File>, String> {
        let ns = namespace(pod);
        if let Some(cm) = &source.config_map {
            let optional = cm.optional.unwrap_or(false);
            let data = required(self.objects()?.config_map(pod, &cm.name).await?, "configmap", ns, &cm.name, optional)?;
            return select(&data, cm.items.as_ref(), mode, &format!("configmap {:?}", cm.name), optional);
        }
        if let Some(secret) = &source.secret {
            let optional = secret.optional.unwrap_or(false);
            let data =
                required(self.objects()?.secret(pod, &secret.name).await?, "secret", ns, &secret.name, optional)?;
            return select(&data, secret.items.as_ref(), mode, &format!("secret {:?}", secret.name), optional);
        }
        if let Some(downward) = &source.downward_api {
            return downward::files(pod, downward.items.iter().flatten(), mode, &self.1);
        }
        if let Some(token) = &source.service_account_token {
            atomic::validate_path(&token.path)?;
            let seconds = token.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS);
            let jwt = self.objects()?.service_account_token(pod, token.audience.as_deref(), seconds).await?;
            // Upstream's mode: the volume's (0644 by default, so a container of any user can
            // read it), but 0600 when every container runs as one user (the token is then
            // that user's) or the pod has an fsGroup (whose read makes it 0640).
            let fs_user = ownership::fs_user(pod);
            let private = fs_user.is_some() || ownership::fs_group(pod).0.is_some();
            let file =
                File { content: jwt.into_bytes(), mode: if private { 0o600 } else { mode_of(mode) }, owner: fs_user };
            return Ok(BTreeMap::from([(token.path.clone(), file)]));
        }
        Err("a projection this agent cannot write".to_owned())
    }
}

impl VolumePlugin for Projected {
    fn name(&self) -> &str {
        PROJECTED
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.projected.as_ref().is_some_and(|p| p.sources.iter().flatten().all(|s| self.projectable(s)))
    }

    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.projected.as_ref().ok_or("not a projected volume")?;
            let mode = source.default_mode.unwrap_or(DEFAULT_MODE);
            let mut payload = BTreeMap::new();
            for projection in source.sources.iter().flatten() {
                payload.extend(self.files(pod, projection, mode).await?);
            }
            write(dir, payload, self.0.is_some(), ownership::fs_group(pod)).await
        })
    }

    fn tear_down<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(tear_down(dir))
    }

    fn read_only(&self) -> bool {
        true
    }

    fn relabels(&self) -> bool {
        true
    }
}
