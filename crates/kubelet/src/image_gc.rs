//! Image garbage collection (upstream `pkg/kubelet/images/image_gc_manager.go`).
//!
//! Every five minutes the runtime's images are listed and remembered with when each was first
//! seen. When the image filesystem is at least `imageGCHighThresholdPercent` full, unused images
//! go, least recently used first, until it is down to `imageGCLowThresholdPercent`; with
//! `imageMaximumGCAge`, images unused for longer go too. An image a container (running or dead)
//! uses, a pinned one (the runtime's sandbox image among them) and one seen for less than
//! `imageMinimumGCAge` always stay.
//!
//! Unlike upstream, which lists every container each round to note which images are in use,
//! the containers are listed only when images are to go (or `imageMaximumGCAge` is set), so a
//! round costs nothing per pod; "least recently used" is then the last round that saw an image
//! in use.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use kubelet_core::{
    clock::wall_now,
    events::{Event, EventRecorder, EventType, ObjectRef},
    runtime::{FsStats, Runtime},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often images are collected (upstream's `ImageGCPeriod`).
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// When images are collected: upstream's `ImageGCPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent` (85): at this usage of the image filesystem, images go;
    /// 100 turns collection off.
    pub high_threshold_percent: u32,
    /// `imageGCLowThresholdPercent` (80): the usage collection brings the filesystem down to.
    pub low_threshold_percent: u32,
    /// `imageMinimumGCAge` (2m): an image seen for less long stays.
    pub min_age: Duration,
    /// `imageMaximumGCAge` (off): an image unused for longer goes, whatever the usage.
    pub max_age: Option<Duration>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: None,
        }
    }
}

impl ImageGcPolicy {
    /// Upstream's thresholds and ages.
    pub fn new(
        high_threshold_percent: u32,
        low_threshold_percent: u32,
        min_age: Duration,
        max_age: Option<Duration>,
    ) -> Self {
        ImageGcPolicy { high_threshold_percent, low_threshold_percent, min_age, max_age }
    }

    /// Whether images are collected at all (`imageGCHighThresholdPercent` below 100).
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent < 100
    }
}

/// Why a collection failed; each is also an event on the node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageGcError {
    /// A runtime call failed.
    #[error("image garbage collection failed: {operation}")]
    Runtime {
        /// The runtime method.
        operation: &'static str,
        /// The runtime's error.
        #[source]
        source: crate::BoxError,
    },
    /// The image filesystem reports no size.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Fewer unused images than needed to reach the low threshold.
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnoughFreed {
        /// The bytes needed.
        wanted: u64,
        /// The bytes freed.
        freed: u64,
    },
}

/// What is known of one image.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ImageRecord {
    /// When this process first saw it.
    first_detected: Timestamp,
    /// When a container was last seen using it; `None` if never.
    last_used: Option<Timestamp>,
    size: u64,
    pinned: bool,
}

/// The bytes to free so the filesystem is down to the low threshold, when it has reached the
/// high one (upstream's arithmetic, in whole percents).
fn amount_to_free(stats: FsStats, policy: &ImageGcPolicy) -> Option<u64> {
    let capacity = u128::from(stats.capacity_bytes);
    let available = u128::from(stats.available_bytes.min(stats.capacity_bytes));
    let usage_percent = 100 - available * 100 / capacity.max(1);
    if usage_percent < u128::from(policy.high_threshold_percent) {
        return None;
    }
    let target_available = capacity * u128::from(100 - policy.low_threshold_percent.min(100)) / 100;
    Some(u64::try_from(target_available.saturating_sub(available)).unwrap_or(u64::MAX))
}

/// The images that may go, in the order they go: unused and unpinned ones, least recently
/// used first (never used before used), then the first seen first.
fn eviction_order(records: &HashMap<String, ImageRecord>, in_use: &HashSet<String>) -> Vec<String> {
    let mut candidates: Vec<(&String, &ImageRecord)> =
        records.iter().filter(|(id, record)| !in_use.contains(*id) && !record.pinned).collect();
    candidates.sort_by(|a, b| (a.1.last_used, a.1.first_detected, a.0).cmp(&(b.1.last_used, b.1.first_detected, b.0)));
    candidates.into_iter().map(|(id, _)| id.clone()).collect()
}

/// Whether `record` has been seen for at least `min_age` by `now`.
fn old_enough(record: &ImageRecord, now: Timestamp, min_age: Duration) -> bool {
    now.duration_since(record.first_detected).unsigned_abs() >= min_age
}

/// Whether `record` was last used more than `max_age` before `now` (never used counts as
/// long ago).
fn unused_for(record: &ImageRecord, now: Timestamp, max_age: Duration) -> bool {
    record.last_used.is_none_or(|used| now.duration_since(used).unsigned_abs() > max_age)
}

/// Collects the images of one runtime.
pub struct ImageGc<R> {
    runtime: Arc<R>,
    policy: ImageGcPolicy,
    recorder: Arc<dyn EventRecorder>,
    node: ObjectRef,
    began: Timestamp,
    records: Mutex<HashMap<String, ImageRecord>>,
}

impl<R> std::fmt::Debug for ImageGc<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGc").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl<R: Runtime> ImageGc<R> {
    /// A collector of `runtime`'s images for node `node_name`, whose events go to `recorder`.
    pub fn new(runtime: Arc<R>, policy: ImageGcPolicy, recorder: Arc<dyn EventRecorder>, node_name: &str) -> Self {
        let mut node = ObjectRef::other("Node", node_name);
        node.uid = node_name.to_owned();
        ImageGc { runtime, policy, recorder, node, began: wall_now(), records: Mutex::new(HashMap::new()) }
    }

    /// Collects at once, then every [`IMAGE_GC_PERIOD`], until `cancel`; nothing when the
    /// policy turns collection off.
    pub async fn run(&self, cancel: CancellationToken) {
        if !self.policy.enabled() {
            info!("imageGCHighThresholdPercent is 100: image garbage collection is off");
            return;
        }
        let mut ticks = tokio::time::interval(IMAGE_GC_PERIOD);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while cancel.run_until_cancelled(ticks.tick()).await.is_some() {
            if let Err(err) = self.garbage_collect().await {
                warn!(error = %kubelet_core::ErrorChain(&err), "image garbage collection failed");
            }
        }
    }

    /// One collection (upstream's `GarbageCollect`); returns the bytes freed. A failure is
    /// also an `ImageGCFailed` event on the node, and a shortfall a `FreeDiskSpaceFailed` one.
    pub async fn garbage_collect(&self) -> Result<u64, ImageGcError> {
        let result = self.collect(wall_now()).await;
        if let Err(err) = &result {
            if matches!(err, ImageGcError::NotEnoughFreed { .. }) {
                self.event("FreeDiskSpaceFailed", err.to_string());
            }
            if matches!(err, ImageGcError::InvalidCapacity) {
                self.event("InvalidDiskCapacity", err.to_string());
            }
            self.event("ImageGCFailed", err.to_string());
        }
        result
    }

    /// Removes every image no container uses and that is older than the minimum age, whatever
    /// the thresholds (upstream `DeleteUnusedImages`, which the eviction manager calls under
    /// disk pressure); returns the bytes freed.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        let now = wall_now();
        self.detect_images(now).await?;
        let in_use = self.detect_use(now).await?;
        let mut freed = 0;
        for id in self.candidates(&in_use, |r| old_enough(r, now, self.policy.min_age)) {
            freed += self.remove(&id, "space").await?;
        }
        Ok(freed)
    }

    fn event(&self, reason: &str, message: String) {
        self.recorder.record(Event::new(EventType::Warning, reason, message, self.node.clone()));
    }

    async fn collect(&self, now: Timestamp) -> Result<u64, ImageGcError> {
        self.detect_images(now).await?;
        let wanted = match self.runtime.image_fs_stats().await.map_err(|e| runtime_error("image_fs_stats", e))? {
            Some(stats) if stats.capacity_bytes == 0 => return Err(ImageGcError::InvalidCapacity),
            Some(stats) => amount_to_free(stats, &self.policy),
            None => None,
        };
        let max_age = self.policy.max_age.filter(|age| now.duration_since(self.began).unsigned_abs() > *age);
        if wanted.is_none() && max_age.is_none() {
            return Ok(0);
        }
        let in_use = self.detect_use(now).await?;
        let mut freed = 0;
        if let Some(max_age) = max_age {
            for id in self.candidates(&in_use, |r| unused_for(r, now, max_age)) {
                freed += self.remove(&id, "age").await?;
            }
        }
        let Some(wanted) = wanted else { return Ok(freed) };
        info!(wanted, "the image filesystem is over the high threshold: removing unused images");
        let mut freed_for_space = 0;
        for id in self.candidates(&in_use, |r| old_enough(r, now, self.policy.min_age)) {
            if freed_for_space >= wanted {
                break;
            }
            freed_for_space += self.remove(&id, "space").await?;
        }
        if freed_for_space < wanted {
            return Err(ImageGcError::NotEnoughFreed { wanted, freed: freed_for_space });
        }
        Ok(freed + freed_for_space)
    }

    /// The images that may go and pass `keep_if`, in eviction order.
    fn candidates(&self, in_use: &HashSet<String>, keep_if: impl Fn(&ImageRecord) -> bool) -> Vec<String> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let order = eviction_order(&records, in_use);
        order.into_iter().filter(|id| records.get(id).is_some_and(&keep_if)).collect()
    }

    /// Lists the images and updates the records: new ones are first seen `now`, gone ones are
    /// forgotten.
    async fn detect_images(&self, now: Timestamp) -> Result<(), ImageGcError> {
        let images = self.runtime.list_images().await.map_err(|e| runtime_error("list_images", e))?;
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| present.contains(id.as_str()));
        for image in &images {
            let record = records.entry(image.id.clone()).or_insert_with(|| ImageRecord {
                first_detected: now,
                last_used: None,
                size: 0,
                pinned: false,
            });
            record.size = image.size;
            record.pinned = image.pinned;
        }
        Ok(())
    }

    /// The IDs of the images a container (running or not) uses, each marked used `now`.
    async fn detect_use(&self, now: Timestamp) -> Result<HashSet<String>, ImageGcError> {
        let pods = self.runtime.get_pods(true).await.map_err(|e| runtime_error("get_pods", e))?;
        let in_use: HashSet<String> =
            pods.iter().flat_map(|p| &p.containers).map(|c| c.image_id.clone()).filter(|id| !id.is_empty()).collect();
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        for id in &in_use {
            if let Some(record) = records.get_mut(id) {
                record.last_used = Some(now);
            }
        }
        Ok(in_use)
    }

    /// Removes image `id`; returns its size.
    async fn remove(&self, id: &str, reason: &'static str) -> Result<u64, ImageGcError> {
        self.runtime.remove_image(id).await.map_err(|e| runtime_error("remove_image", e))?;
        let record = self.records.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
        let size = record.map_or(0, |r| r.size);
        metrics::counter!("kubelet_image_garbage_collected_total", "reason" => reason).increment(1);
        info!(image.id = id, size, reason, "removed an unused image");
        Ok(size)
    }
}

fn runtime_error(operation: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> ImageGcError {
    ImageGcError::Runtime { operation, source: Box::new(source) }
}

#[cfg(test)]
mod tests {
    use kubelet_core::{events::RingRecorder, fake::FakeRuntime};

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn record(first: i64, used: Option<i64>, pinned: bool) -> ImageRecord {
        ImageRecord { first_detected: at(first), last_used: used.map(at), size: 10, pinned }
    }

    #[test]
    fn thresholds_as_upstreams() {
        let policy = ImageGcPolicy::default();
        assert_eq!(amount_to_free(FsStats::new(1000, 160), &policy), None, "84 % used");
        assert_eq!(amount_to_free(FsStats::new(1000, 150), &policy), Some(50), "85 %: down to 80 %");
        assert_eq!(amount_to_free(FsStats::new(1000, 0), &policy), Some(200));
        assert_eq!(amount_to_free(FsStats::new(1000, 5000), &policy), None, "available capped at capacity");
    }

    #[test]
    fn least_recently_used_unused_unpinned_images_go_first() {
        let records = HashMap::from([
            ("used-long-ago".to_owned(), record(0, Some(10), false)),
            ("never-used-new".to_owned(), record(50, None, false)),
            ("never-used-old".to_owned(), record(5, None, false)),
            ("used-lately".to_owned(), record(0, Some(90), false)),
            ("running".to_owned(), record(0, Some(100), false)),
            ("pause".to_owned(), record(0, None, true)),
        ]);
        let in_use = HashSet::from(["running".to_owned()]);
        assert_eq!(
            eviction_order(&records, &in_use),
            ["never-used-old", "never-used-new", "used-long-ago", "used-lately"]
        );
        assert!(!old_enough(&records["never-used-new"], at(100), Duration::from_secs(60)));
        assert!(old_enough(&records["never-used-new"], at(110), Duration::from_secs(60)));
        assert!(unused_for(&records["never-used-new"], at(60), Duration::from_secs(3600)), "never used");
        assert!(!unused_for(&records["used-lately"], at(100), Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn a_full_image_filesystem_loses_unused_images_down_to_the_low_threshold() {
        let runtime = Arc::new(FakeRuntime::new());
        runtime.set_image_size("old:1", 100);
        runtime.set_image_size("other:1", 100);
        runtime.set_image_fs(FsStats::new(1000, 100));
        let recorder = Arc::new(RingRecorder::default());
        let policy = ImageGcPolicy::new(85, 80, Duration::ZERO, None);
        let gc = ImageGc::new(runtime.clone(), policy, recorder.clone(), "node-1");
        // 90 % used: 100 bytes to free, one image of 100 bytes is enough.
        assert_eq!(gc.garbage_collect().await.unwrap(), 100);
        assert_eq!(runtime.list_images().await.unwrap().len(), 1);
        // Still 90 % (the fake's filesystem does not change): not enough left to free.
        runtime.set_image_fs(FsStats::new(1000, 0));
        let err = gc.garbage_collect().await.unwrap_err();
        assert!(matches!(err, ImageGcError::NotEnoughFreed { wanted: 200, freed: 100 }), "{err}");
        let reasons: Vec<String> = recorder.events().into_iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["FreeDiskSpaceFailed", "ImageGCFailed"]);
        assert!(runtime.list_images().await.unwrap().is_empty());
    }
}
