//! Image garbage collection, as upstream's image GC manager: every 5 minutes (and on demand
//! from the eviction manager) images unused for `imageMaximumGCAge` are removed, and when the
//! image filesystem is used above `imageGCHighThresholdPercent`, unused images are removed
//! least recently used first until use falls to `imageGCLowThresholdPercent`. An image in use
//! by any container (running or not), a pinned image (CRI `pinned`) and the configured sandbox
//! image are never removed, nor an image first seen less than `imageMinimumGCAge` ago. When
//! and how recently an image was seen is kept in memory, as upstream (images present at start
//! count as first seen then). After each collection the pulled-image records
//! ([`super::pull_records`]) of images no longer present are removed.

/// Upstream's image GC policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageGcPolicy {
    pub high_threshold_percent: i32,
    pub low_threshold_percent: i32,
    #[serde(with = "duration::serde_opt_plain")]
    pub min_age: Duration,
    /// 0: images are never removed for age alone.
    #[serde(with = "duration::serde_opt_plain")]
    pub max_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

use crate::events::{EventRecorder, EventType};
use crate::runtime::{ImageSummary, Runtime};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use plumbing::duration;
use serde::Serialize;

/// The sandbox image kept when `--pod-infra-container-image` is not given (containerd's
/// default, and the rig's): runtimes older than CRI `pinned` (containerd 1.6) do not pin it,
/// and no sandbox could start without it.
pub const DEFAULT_SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Upstream's ImageGCPeriod.
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// Test hook: a Go duration replacing [`IMAGE_GC_PERIOD`] (the e2e tests cannot wait five
/// minutes for the second collection). Not a setting: the agent warns when it is set.
pub const PERIOD_ENV: &str = "KUBELET_TEST_IMAGE_GC_PERIOD";

/// Whether the periodic collection is off, as upstream: `imageGCHighThresholdPercent: 100`
/// with no `imageMaximumGCAge` (with a maximum age, images are still removed for age).
pub fn periodic_gc_disabled(policy: &ImageGcPolicy) -> bool {
    policy.high_threshold_percent == 100 && policy.max_age.is_zero()
}

/// Errors of one collection.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error("failed to get image filesystem stats: {0}")]
    Stats(String),
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnough { wanted: u64, freed: u64 },
}

/// The image filesystem's size (capacity and available bytes).
#[async_trait::async_trait]
pub trait ImageFs: Send + Sync {
    async fn image_fs(&self) -> Result<(u64, u64), ImageGcError>;
}

#[async_trait::async_trait]
impl ImageFs for crate::stats::Provider {
    async fn image_fs(&self) -> Result<(u64, u64), ImageGcError> {
        let snap = self
            .refresh()
            .await
            .map_err(|e| ImageGcError::Stats(e.to_string()))?;
        let fs = snap
            .summary
            .node
            .runtime
            .as_ref()
            .and_then(|r| r.image_fs.as_ref())
            .ok_or_else(|| ImageGcError::Stats("no image filesystem stats".into()))?;
        match (fs.capacity_bytes, fs.available_bytes) {
            (Some(c), Some(a)) => Ok((c, a)),
            _ => Err(ImageGcError::Stats("image filesystem size unknown".into())),
        }
    }
}

/// What is remembered of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub first_detected: Instant,
    /// None: never seen in use (such images go first, as upstream's zero time).
    pub last_used: Option<Instant>,
    pub size: u64,
    pub pinned: bool,
}

/// Updates `records` from a listing at `now` (upstream's detectImages): new images are first
/// seen now, images in use were last used now, vanished images are forgotten.
pub fn detect(
    records: &mut HashMap<String, Record>,
    images: &[ImageSummary],
    in_use: &HashSet<String>,
    now: Instant,
) {
    let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
    records.retain(|id, _| present.contains(id.as_str()));
    for i in images {
        let r = records.entry(i.id.clone()).or_insert(Record {
            first_detected: now,
            last_used: None,
            size: i.size,
            pinned: i.pinned,
        });
        r.size = i.size;
        r.pinned = i.pinned;
        if in_use.contains(&i.id) {
            r.last_used = Some(now);
        }
    }
}

/// The images whose removal frees `bytes`, least recently used first (then first seen
/// first), skipping images in use, pinned ones and those younger than `min_age`. Returns them
/// and what they free (less than `bytes` when not enough are eligible).
pub fn choose_for_space(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    bytes: u64,
    min_age: Duration,
    now: Instant,
) -> (Vec<String>, u64) {
    let mut candidates: Vec<(&String, &Record)> = records
        .iter()
        .filter(|(id, r)| {
            !in_use.contains(*id)
                && !r.pinned
                && now.saturating_duration_since(r.first_detected) >= min_age
        })
        .collect();
    candidates.sort_by(|a, b| {
        (a.1.last_used, a.1.first_detected, a.0).cmp(&(b.1.last_used, b.1.first_detected, b.0))
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for (id, r) in candidates {
        if freed >= bytes {
            break;
        }
        out.push(id.clone());
        freed = freed.saturating_add(r.size);
    }
    (out, freed)
}

/// Images unused for longer than `max_age` (0: none).
pub fn choose_for_age(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    max_age: Duration,
    now: Instant,
) -> Vec<String> {
    if max_age.is_zero() {
        return Vec::new();
    }
    let mut out: Vec<String> = records
        .iter()
        .filter(|(id, r)| {
            !in_use.contains(*id)
                && !r.pinned
                && now.saturating_duration_since(r.last_used.unwrap_or(r.first_detected)) > max_age
        })
        .map(|(id, _)| id.clone())
        .collect();
    out.sort();
    out
}

/// Upstream's arithmetic: how many bytes to free for this capacity and availability (0 when
/// use is below the high threshold).
pub fn bytes_to_free(capacity: u64, available: u64, policy: &ImageGcPolicy) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let available = available.min(capacity);
    let usage_percent = 100 - (available as u128 * 100 / capacity as u128) as i64;
    if usage_percent < i64::from(policy.high_threshold_percent) {
        return 0;
    }
    let target_available =
        capacity as u128 * (100 - policy.low_threshold_percent.clamp(0, 100) as u128) / 100;
    (target_available as u64).saturating_sub(available)
}

/// The image garbage collector; see the module doc.
pub struct ImageGc {
    pub runtime: Arc<dyn Runtime>,
    pub fs: Arc<dyn ImageFs>,
    pub policy: ImageGcPolicy,
    pub events: Arc<dyn EventRecorder>,
    pub node_name: String,
    /// The sandbox (pause) image: kept even when the runtime does not pin it.
    pub sandbox_image: Option<String>,
    /// Time between periodic collections ([`IMAGE_GC_PERIOD`]).
    pub period: Duration,
    records: Mutex<HashMap<String, Record>>,
    /// Pulled-image records, pruned after each collection.
    pull_records: Option<Arc<super::pull_records::PullRecords>>,
}

impl ImageGc {
    pub fn new(
        runtime: Arc<dyn Runtime>,
        fs: Arc<dyn ImageFs>,
        policy: ImageGcPolicy,
        events: Arc<dyn EventRecorder>,
        node_name: String,
        sandbox_image: Option<String>,
    ) -> Self {
        Self {
            runtime,
            fs,
            policy,
            events,
            node_name,
            sandbox_image,
            period: IMAGE_GC_PERIOD,
            records: Mutex::new(HashMap::new()),
            pull_records: None,
        }
    }

    /// The same collector, pruning these pulled-image records after each collection.
    pub fn with_pull_records(mut self, records: Arc<super::pull_records::PullRecords>) -> Self {
        self.pull_records = Some(records);
        self
    }

    /// Removes the pulled-image records of images not in the last listing (less those
    /// removed since), unless updated after `began` (upstream's PruneUnknownRecords as a
    /// post-GC hook).
    async fn prune_pull_records(&self, began: jiff::Timestamp) {
        let Some(records) = &self.pull_records else {
            return;
        };
        let ids: Vec<String> = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        records.prune_unknown_records_async(ids, began).await;
    }

    /// The same collector with another period between collections.
    pub fn with_period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Collects at start and then every `period` ([`IMAGE_GC_PERIOD`]) until cancelled
    /// (upstream's wait.Until); see [`periodic_gc_disabled`] for when it does not run.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        if periodic_gc_disabled(&self.policy) {
            tracing::info!(
                "ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC"
            );
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "image GC: image detection failed");
            }
            return;
        }
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(self.period) => {}
                }
            }
            first = false;
            if let Err(e) = self.garbage_collect().await {
                tracing::warn!(error = %e, "Image garbage collection failed");
                if matches!(e, ImageGcError::NotEnough { .. }) {
                    self.events.record(
                        &crate::events::node_ref(&self.node_name),
                        EventType::Warning,
                        "FreeDiskSpaceFailed",
                        &e.to_string(),
                    );
                }
            }
        }
    }

    /// Lists images and containers and updates the records; returns the images in use
    /// (by ID; the sandbox image and pinned images are added as in use).
    async fn refresh(&self) -> Result<HashSet<String>, ImageGcError> {
        let images = self.runtime.list_images().await?;
        let containers = self.runtime.list_containers().await?;
        let mut refs: HashSet<&str> = HashSet::new();
        for c in &containers {
            refs.insert(c.image_ref.as_str());
            refs.insert(c.image.as_str());
        }
        if let Some(s) = &self.sandbox_image {
            refs.insert(s.as_str());
        }
        let in_use: HashSet<String> = images
            .iter()
            .filter(|i| {
                refs.contains(i.id.as_str())
                    || i.repo_tags.iter().any(|t| refs.contains(t.as_str()))
                    || i.repo_digests.iter().any(|d| refs.contains(d.as_str()))
            })
            .map(|i| i.id.clone())
            .collect();
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        detect(&mut records, &images, &in_use, Instant::now());
        Ok(in_use)
    }

    async fn remove(&self, ids: &[String], reason: &str) -> u64 {
        let mut freed = 0;
        for id in ids {
            let size = self
                .records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(id)
                .map_or(0, |r| r.size);
            tracing::info!(image = %id, size, reason, "removing image to free bytes");
            match self.runtime.remove_image(id).await {
                Ok(()) => {
                    freed += size;
                    self.records
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(id);
                    crate::metrics::families()
                        .image_garbage_collected
                        .with_label_values(&[reason])
                        .inc();
                }
                Err(e) => tracing::warn!(image = %id, error = %e, "failed to remove image"),
            }
        }
        freed
    }

    /// One periodic collection (upstream's GarbageCollect), then the records of images gone
    /// are pruned.
    pub async fn garbage_collect(&self) -> Result<(), ImageGcError> {
        let began = jiff::Timestamp::now();
        let result = self.collect().await;
        if !matches!(result, Err(ImageGcError::Runtime(_))) {
            self.prune_pull_records(began).await;
        }
        result
    }

    async fn collect(&self) -> Result<(), ImageGcError> {
        let in_use = self.refresh().await?;
        let now = Instant::now();
        let old = {
            let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
            choose_for_age(&records, &in_use, self.policy.max_age, now)
        };
        self.remove(&old, "age").await;
        let (capacity, available) = self.fs.image_fs().await?;
        if capacity == 0 {
            let e = ImageGcError::InvalidCapacity;
            self.events.record(
                &crate::events::node_ref(&self.node_name),
                EventType::Warning,
                "InvalidDiskCapacity",
                &e.to_string(),
            );
            return Err(e);
        }
        let wanted = bytes_to_free(capacity, available, &self.policy);
        if wanted == 0 {
            return Ok(());
        }
        tracing::info!(
            usage_percent = 100 - available.min(capacity) * 100 / capacity.max(1),
            high = self.policy.high_threshold_percent,
            low = self.policy.low_threshold_percent,
            capacity,
            available,
            wanted,
            "image filesystem above the high threshold: removing images"
        );
        let freed = self.free(wanted, &in_use, now, "space").await;
        if freed < wanted {
            return Err(ImageGcError::NotEnough { wanted, freed });
        }
        Ok(())
    }

    async fn free(&self, bytes: u64, in_use: &HashSet<String>, now: Instant, reason: &str) -> u64 {
        let (ids, _) = {
            let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
            choose_for_space(&records, in_use, bytes, self.policy.min_age, now)
        };
        self.remove(&ids, reason).await
    }

    /// Every unused image old enough (upstream's DeleteUnusedImages, for the eviction
    /// manager).
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        let began = jiff::Timestamp::now();
        let in_use = self.refresh().await?;
        let freed = self.free(u64::MAX, &in_use, Instant::now(), "space").await;
        self.prune_pull_records(began).await;
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(id: &str, size: u64, pinned: bool) -> ImageSummary {
        ImageSummary {
            id: id.into(),
            repo_tags: vec![format!("r/{id}:1")],
            repo_digests: Vec::new(),
            size,
            pinned,
        }
    }

    #[test]
    fn frees_least_recently_used_first_and_never_in_use_pinned_or_young_images() {
        let t0 = Instant::now();
        let mut records = HashMap::new();
        let images = vec![
            img("old", 100, false),
            img("newer", 100, false),
            img("used", 500, false),
            img("pause", 50, true),
        ];
        detect(
            &mut records,
            &images,
            &["used".to_string(), "newer".to_string()].into(),
            t0,
        );
        // Later "newer" stops being used; "old" was unused all along.
        let t1 = t0 + Duration::from_secs(600);
        detect(&mut records, &images, &["used".to_string()].into(), t1);
        let late = img("late", 100, false);
        let mut all = images.clone();
        all.push(late);
        detect(&mut records, &all, &["used".to_string()].into(), t1);
        let in_use: HashSet<String> = ["used".to_string()].into();
        let min_age = Duration::from_secs(120);
        // "old" (never used) and "newer" (last used at t0) go; "late" is too young.
        let (ids, freed) = choose_for_space(&records, &in_use, 150, min_age, t1);
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&"old".to_string()) && ids.contains(&"newer".to_string()));
        assert_eq!(freed, 200);
        let (ids, freed) = choose_for_space(&records, &in_use, u64::MAX, min_age, t1);
        assert_eq!(freed, 200, "{ids:?}: used, pinned and young images stay");
        // Two minutes on, "late" is old enough.
        let (ids, _) = choose_for_space(&records, &in_use, u64::MAX, min_age, t1 + min_age);
        assert!(ids.contains(&"late".to_string()));
        // Vanished images are forgotten.
        detect(&mut records, &images[..1], &HashSet::new(), t1);
        assert_eq!(records.len(), 1);
    }

    #[test]
    fn least_recently_used_goes_first() {
        let t0 = Instant::now();
        let mut records = HashMap::new();
        let images = vec![img("a", 10, false), img("b", 10, false)];
        detect(&mut records, &images, &["b".to_string()].into(), t0);
        detect(
            &mut records,
            &images,
            &["a".to_string()].into(),
            t0 + Duration::from_secs(300),
        );
        let (ids, _) = choose_for_space(
            &records,
            &HashSet::new(),
            5,
            Duration::ZERO,
            t0 + Duration::from_secs(400),
        );
        assert_eq!(ids, ["b"]);
    }

    const MIB: u64 = 1 << 20;

    /// A collector over a fake runtime holding `images`, whose stats provider sees the node's
    /// root filesystem 40 % used and `image_fs` mounted at containerd's root (the fake's
    /// ImageFsInfo names the overlayfs snapshotter's mountpoint below it, as containerd does).
    fn collector(
        images: &[&str],
        image_fs: crate::stats::FsInfo,
        policy: ImageGcPolicy,
    ) -> (
        ImageGc,
        Arc<crate::runtime::fake::FakeRuntime>,
        Arc<crate::events::FakeRecorder>,
        tempfile::TempDir,
    ) {
        use crate::stats::FsInfo;
        use crate::stats::node::FakeNode;
        let rt = Arc::new(crate::runtime::fake::FakeRuntime::new());
        for i in images {
            rt.add_image(i);
        }
        let node = Arc::new(FakeNode {
            fs: FsInfo {
                capacity_bytes: 1000 * MIB,
                available_bytes: 600 * MIB,
                used_bytes: 400 * MIB,
                inodes: 1000,
                inodes_free: 900,
            },
            fs_at: [("/var/lib/containerd".into(), image_fs)].into(),
            ..FakeNode::default()
        });
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(crate::stats::Provider::new(
            rt.clone(),
            node,
            crate::stats::ProviderConfig::new(
                "node-a".into(),
                dir.path().join("root"),
                dir.path().join("logs"),
            ),
        ));
        let events = Arc::new(crate::events::FakeRecorder::default());
        let gc = ImageGc::new(
            rt.clone(),
            stats,
            policy,
            events.clone(),
            "node-a".into(),
            Some(DEFAULT_SANDBOX_IMAGE.into()),
        );
        (gc, rt, events, dir)
    }

    fn tags(images: Vec<ImageSummary>) -> Vec<String> {
        images.into_iter().flat_map(|i| i.repo_tags).collect()
    }

    #[tokio::test]
    async fn usage_is_read_from_the_filesystem_holding_the_runtimes_image_mountpoint() {
        // The root filesystem is 40 % used, the one under the snapshotter's mountpoint 70 %:
        // the image filesystem is over the 60 % threshold, so the unused image goes and the
        // sandbox image stays.
        let policy = ImageGcPolicy {
            high_threshold_percent: 60,
            low_threshold_percent: 40,
            min_age: Duration::ZERO,
            max_age: Duration::ZERO,
        };
        let image_fs = crate::stats::FsInfo {
            capacity_bytes: 100 * MIB,
            available_bytes: 30 * MIB,
            used_bytes: 70 * MIB,
            inodes: 100,
            inodes_free: 90,
        };
        let (gc, rt, _events, _dir) = collector(
            &["r/unused:1", DEFAULT_SANDBOX_IMAGE],
            image_fs,
            policy.clone(),
        );
        assert_eq!(gc.fs.image_fs().await.unwrap(), (100 * MIB, 30 * MIB));
        let err = gc.garbage_collect().await.unwrap_err();
        // 60 % of 100 MiB must be free: 30 MiB more than now, more than the one image frees.
        assert!(
            matches!(err, ImageGcError::NotEnough { wanted, .. } if wanted == 30 * MIB),
            "{err}"
        );
        assert_eq!(
            tags(rt.list_images().await.unwrap()),
            [DEFAULT_SANDBOX_IMAGE]
        );

        // The same node with a roomy image filesystem: nothing is removed.
        let roomy = crate::stats::FsInfo {
            available_bytes: 90 * MIB,
            used_bytes: 10 * MIB,
            ..image_fs
        };
        let (gc, rt, events, _dir) = collector(&["r/unused:1"], roomy, policy);
        gc.garbage_collect().await.unwrap();
        assert_eq!(tags(rt.list_images().await.unwrap()), ["r/unused:1"]);
        assert!(events.events().is_empty());
    }

    #[tokio::test]
    async fn records_of_removed_images_go_with_them() {
        use crate::images::pull_records::{PullRecords, VerifyPolicy, format::ImagePulledRecord};
        let policy = ImageGcPolicy {
            high_threshold_percent: 60,
            low_threshold_percent: 40,
            min_age: Duration::ZERO,
            max_age: Duration::ZERO,
        };
        let full = crate::stats::FsInfo {
            capacity_bytes: 100 * MIB,
            available_bytes: 30 * MIB,
            used_bytes: 70 * MIB,
            inodes: 100,
            inodes_free: 90,
        };
        let (gc, rt, _events, dir) =
            collector(&["r/unused:1", DEFAULT_SANDBOX_IMAGE], full, policy);
        let records =
            Arc::new(PullRecords::open(&dir.path().join("root"), VerifyPolicy::default()).unwrap());
        let gc = gc.with_pull_records(records.clone());
        let id = |tag: &str| {
            let rt = rt.clone();
            let tag = tag.to_string();
            async move {
                rt.list_images()
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|i| i.repo_tags.contains(&tag))
                    .unwrap()
                    .id
            }
        };
        let (unused, pause) = (id("r/unused:1").await, id(DEFAULT_SANDBOX_IMAGE).await);
        // Records written a minute before the collection (and one of an image long gone).
        let old = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
        for image_ref in [&unused, &pause, &"sha256:gone".to_string()] {
            let mut r = ImagePulledRecord::new(image_ref, old);
            r.credential_mapping.insert(
                "r/x".into(),
                crate::images::pull_records::format::ImagePullCredentials {
                    node_pods_accessible: true,
                    ..Default::default()
                },
            );
            records.store().write_pulled(&r).unwrap();
        }
        // The unused image goes (not enough freed: still an error), its record too.
        assert!(gc.garbage_collect().await.is_err());
        assert_eq!(
            tags(rt.list_images().await.unwrap()),
            [DEFAULT_SANDBOX_IMAGE]
        );
        assert!(records.store().get_pulled(&unused).unwrap().is_none());
        assert!(records.store().get_pulled("sha256:gone").unwrap().is_none());
        assert!(records.store().get_pulled(&pause).unwrap().is_some());
    }

    #[tokio::test]
    async fn a_zero_capacity_image_filesystem_is_an_error_and_an_event() {
        let zero = crate::stats::FsInfo::default();
        let policy = ImageGcPolicy {
            min_age: Duration::ZERO,
            ..ImageGcPolicy::default()
        };
        let (gc, rt, events, _dir) = collector(&["r/unused:1"], zero, policy);
        let err = gc.garbage_collect().await.unwrap_err();
        assert!(matches!(err, ImageGcError::InvalidCapacity), "{err}");
        assert_eq!(
            events.events(),
            ["Warning InvalidDiskCapacity invalid capacity 0 on image filesystem"]
        );
        assert_eq!(tags(rt.list_images().await.unwrap()), ["r/unused:1"]);
    }

    #[test]
    fn periodic_collection_is_off_only_at_100_percent_without_a_maximum_age() {
        let mut p = ImageGcPolicy {
            high_threshold_percent: 100,
            ..ImageGcPolicy::default()
        };
        assert!(periodic_gc_disabled(&p));
        p.max_age = Duration::from_secs(3600);
        assert!(!periodic_gc_disabled(&p), "images still age out");
        assert!(!periodic_gc_disabled(&ImageGcPolicy::default()));
    }

    #[test]
    fn thresholds_and_max_age() {
        let p = ImageGcPolicy::default();
        // 84 % used: nothing to do; 90 % used: free down to 80 %.
        assert_eq!(bytes_to_free(1000, 160, &p), 0);
        assert_eq!(bytes_to_free(1000, 100, &p), 100);
        assert_eq!(bytes_to_free(1000, 150, &p), 50);
        let t0 = Instant::now();
        let mut records = HashMap::new();
        detect(
            &mut records,
            &[img("a", 1, false), img("p", 1, true)],
            &HashSet::new(),
            t0,
        );
        let later = t0 + Duration::from_secs(3601);
        assert!(choose_for_age(&records, &HashSet::new(), Duration::ZERO, later).is_empty());
        assert_eq!(
            choose_for_age(&records, &HashSet::new(), Duration::from_secs(3600), later),
            ["a"]
        );
    }
}
