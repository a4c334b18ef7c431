//! Images: the pull policy and pull backoff of a container's image, pulls bounded by
//! `maxParallelImagePulls`, and the image service calls.

use super::*;

impl CriRuntime {
    /// Makes sure the container's image is present (upstream `EnsureImageExists`); returns its
    /// reference, and its user when the image was already present (one `ImageStatus` answers
    /// both, where upstream asks twice).
    pub(super) async fn ensure_image(
        &self,
        pod: &ApiPod,
        container: &ApiContainer,
    ) -> Result<(String, Option<container::ImageUser>), SyncFailure> {
        let image = container.image.clone().unwrap_or_default();
        if image.trim().is_empty() {
            return Err(SyncFailure::new(
                reasons::INVALID_IMAGE_NAME,
                format!("container {} has no image", container.name),
            ));
        }
        let policy = container.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let present = image_status(self, &image)
            .await
            .map_err(|e| SyncFailure::new("ImageInspectError", format!("Failed to inspect image {image:?}: {e}")))?;
        if let Some(found) = present.as_ref().filter(|_| policy != "Always") {
            self.event(
                pod,
                EventType::Normal,
                "Pulled",
                format!("Container image {image:?} already present on machine"),
            );
            return Ok((found.id.clone(), Some(user_of(found))));
        }
        if policy == "Never" {
            let message = format!("Container image {image:?} is not present with pull policy of Never");
            self.event(pod, EventType::Warning, reasons::ERR_IMAGE_NEVER_PULL, message.clone());
            return Err(SyncFailure::new(reasons::ERR_IMAGE_NEVER_PULL, message));
        }
        let key = format!("{}_{image}", pod_meta(pod).2);
        let now = Instant::now();
        if self.image_backoff.is_in_backoff_since_update(&key, now) {
            let message = format!("Back-off pulling image {image:?}");
            self.event(pod, EventType::Normal, "BackOff", message.clone());
            // The pod is synced again the moment the back-off ends, not at the next resync.
            let remaining = self.image_backoff.remaining_since_update(&key, now);
            return Err(SyncFailure::new(reasons::IMAGE_PULL_BACK_OFF, message).with_retry_after(remaining));
        }
        self.event(pod, EventType::Normal, "Pulling", format!("Pulling image {image:?}"));
        let started = Instant::now();
        let uid = kubelet_core::PodUid::of(pod);
        if let Some(tracker) = &self.startup {
            tracker.pulling_started(&uid, started);
        }
        let auths = self.pull_credentials(pod, &image).await;
        let pulled = pull_with(self, &image, &auths).await;
        if let Some(tracker) = &self.startup {
            tracker.pulling_finished(&uid, Instant::now());
        }
        match pulled {
            Ok(reference) => {
                self.image_backoff.reset(&key);
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image {image:?} in {:?}", started.elapsed()),
                );
                Ok((reference, None))
            }
            Err(err) => {
                self.image_backoff.next(&key, Instant::now());
                let message = format!("Failed to pull image {image:?}: {err}");
                self.event(pod, EventType::Warning, "Failed", message.clone());
                // Retried when the back-off just started ends: about 10 s, 20 s, 40 s, ...
                let retry = self.image_backoff.get(&key);
                Err(SyncFailure::new(reasons::ERR_IMAGE_PULL, message).with_retry_after(retry))
            }
        }
    }

    /// The credentials of the pod's `imagePullSecrets` for `image`; a secret that cannot be read
    /// is upstream's `FailedToRetrieveImagePullSecret` event, and the pull goes on without it.
    async fn pull_credentials(&self, pod: &ApiPod, image: &str) -> Vec<pb::AuthConfig> {
        let names: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        let Some(source) = self.objects.as_ref().filter(|_| !names.is_empty()) else { return Vec::new() };
        let mut secrets = Vec::new();
        for name in names {
            match source.secret(pod, name).await {
                Ok(Some(data)) => secrets.push(data),
                Ok(None) | Err(_) => self.event(
                    pod,
                    EventType::Warning,
                    "FailedToRetrieveImagePullSecret",
                    format!("Unable to retrieve some image pull secrets ({name}); attempting to pull the image may not succeed."),
                ),
            }
        }
        credentials::for_image(image, &secrets)
    }

    /// Whether a pull may start now: a token of `registryPullQPS` is taken, when limited.
    fn may_pull_now(&self) -> bool {
        let Some(tokens) = &self.pull_tokens else { return true };
        // Each critical section takes a token whole: a poisoned bucket is whole.
        tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner).try_take(Instant::now())
    }

    pub(super) async fn image_user(&self, image_ref: &str) -> container::ImageUser {
        let request = pb::ImageStatusRequest {
            image: Some(pb::ImageSpec { image: image_ref.to_owned(), ..Default::default() }),
            verbose: false,
        };
        let image = match self.client.image_service().image_status(request).await {
            Ok(response) => response.into_inner().image,
            Err(_) => None,
        };
        image.as_ref().map(user_of).unwrap_or_default()
    }
}

/// The user an image runs as.
fn user_of(image: &pb::Image) -> container::ImageUser {
    container::ImageUser { uid: image.uid.as_ref().map(|u| u.value), username: image.username.clone() }
}

/// The runtime's record of `image`, or `None` when it is not present.
async fn image_status(rt: &CriRuntime, image: &str) -> Result<Option<pb::Image>, Error> {
    let request = pb::ImageStatusRequest {
        image: Some(pb::ImageSpec { image: image.to_owned(), ..Default::default() }),
        verbose: false,
    };
    let response =
        rt.client.image_service().image_status(request).await.map_err(|s| Error::status("ImageStatus", s))?;
    Ok(response.into_inner().image)
}

pub(super) async fn pull_image(rt: &CriRuntime, image: &str) -> Result<String, Error> {
    pull_with(rt, image, &[]).await
}

/// Pulls `image` with each of `auths` in turn until one succeeds (without credentials when there
/// are none); the last failure otherwise.
async fn pull_with(rt: &CriRuntime, image: &str, auths: &[pb::AuthConfig]) -> Result<String, Error> {
    // The semaphore is never closed, so `acquire` only fails if it were; then pull unlimited.
    let _permit = match &rt.image_pulls {
        Some(pulls) => pulls.acquire().await.ok(),
        None => None,
    };
    if !rt.may_pull_now() {
        return Err(Error::PullQpsExceeded);
    }
    let attempts: Vec<Option<pb::AuthConfig>> =
        if auths.is_empty() { vec![None] } else { auths.iter().cloned().map(Some).collect() };
    let mut last = None;
    for auth in attempts {
        let request = pb::PullImageRequest {
            image: Some(pb::ImageSpec { image: image.to_owned(), ..Default::default() }),
            auth,
            ..Default::default()
        };
        match rt.client.image_service().pull_image(request).await {
            Ok(response) => return Ok(response.into_inner().image_ref),
            Err(status) => last = Some(Error::status("PullImage", status)),
        }
    }
    Err(last.unwrap_or_else(|| Error::status("PullImage", tonic::Status::unknown("no pull was attempted"))))
}

pub(super) async fn image_ref(rt: &CriRuntime, image: &str) -> Result<Option<String>, Error> {
    Ok(image_status(rt, image).await?.map(|i| i.id))
}

/// The runtime's images, with the sandbox image its configuration names marked pinned: a
/// runtime that does not pin it itself (containerd 1.6) would have it removed by image GC.
pub(super) async fn list_images(rt: &CriRuntime) -> Result<Vec<Image>, Error> {
    let sandbox_image = sandbox_image_id(rt).await;
    let response = rt
        .client
        .image_service()
        .list_images(pb::ListImagesRequest { filter: None })
        .await
        .map_err(|s| Error::status("ListImages", s))?;
    Ok(response
        .into_inner()
        .images
        .into_iter()
        .map(|i| {
            let mut image = Image::default();
            image.id = i.id;
            image.repo_tags = i.repo_tags;
            image.repo_digests = i.repo_digests;
            image.size = i.size;
            image.pinned = i.pinned || sandbox_image.as_deref() == Some(image.id.as_str());
            image
        })
        .collect())
}

/// The ID of the sandbox image named in the runtime's configuration (containerd's
/// `sandboxImage` in the verbose `Status`), when the runtime says and has it.
async fn sandbox_image_id(rt: &CriRuntime) -> Option<String> {
    let request = pb::StatusRequest { verbose: true };
    let info = rt.client.runtime_service().status(request).await.ok()?.into_inner().info;
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    let image = config.get("sandboxImage")?.as_str()?;
    image_ref(rt, image).await.ok().flatten()
}

/// How full the filesystem holding the runtime's images is: CRI `ImageFsInfo` names its mount
/// point, and `statvfs` says its size and what is free.
pub(super) async fn image_fs_stats(rt: &CriRuntime) -> Result<Option<FsStats>, Error> {
    let response = rt
        .client
        .image_service()
        .image_fs_info(pb::ImageFsInfoRequest {})
        .await
        .map_err(|s| Error::status("ImageFsInfo", s))?;
    let filesystems = response.into_inner().image_filesystems;
    let Some(mountpoint) = filesystems.into_iter().find_map(|f| f.fs_id.map(|id| id.mountpoint)) else {
        return Ok(None);
    };
    let measured = {
        let mountpoint = mountpoint.clone();
        tokio::task::spawn_blocking(move || {
            nix::sys::statvfs::statvfs(mountpoint.as_str()).map_err(std::io::Error::from)
        })
        .await
        .unwrap_or_else(|joined| Err(std::io::Error::other(joined)))
    };
    let stats = measured.map_err(|source| Error::ImageFs { mountpoint, source })?;
    let block = stats.fragment_size();
    let mut fs = FsStats::new(stats.blocks() * block, stats.blocks_available() * block)
        .with_inodes(stats.files(), stats.files_free());
    fs.filesystem_id = Some(stats.filesystem_id());
    Ok(Some(fs))
}

pub(super) async fn remove_image(rt: &CriRuntime, image: &str) -> Result<(), Error> {
    let request =
        pb::RemoveImageRequest { image: Some(pb::ImageSpec { image: image.to_owned(), ..Default::default() }) };
    rt.client.image_service().remove_image(request).await.map_err(|s| Error::status("RemoveImage", s))?;
    Ok(())
}
