//! Starts the eviction manager, image GC and container GC on the real edges: the stats
//! provider, the sync loop's control channel and the CRI runtime.

use crate::cm::{Amount, Signal};
use crate::config::Config;
use crate::events::EventRecorder;
use crate::eviction::{
    EvictionError, Manager, NodeReclaim, POD_CLEANUP_TIMEOUT, Parts, PodKiller, PressureState,
    ProviderStats,
};
use crate::images::ImageGc;
use crate::podspec::Stopped;
use crate::runtime::Runtime;
use crate::runtime::{ContainerGc, PodsKnown};
use crate::sync_loop::Control;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The sync loop as container GC's view of which pods exist.
pub struct SyncLoopPods(pub mpsc::Sender<Control>);

#[async_trait::async_trait]
impl PodsKnown for SyncLoopPods {
    async fn known_pods(&self) -> Option<HashSet<String>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.0.send(Control::KnownPods(tx)).await.ok()?;
        rx.await.ok().flatten()
    }
}

/// The sync loop as the manager's [`PodKiller`] (`Control::ActivePods` / `Control::Stop`).
pub struct SyncLoopKiller(pub tokio::sync::mpsc::Sender<Control>);

#[async_trait::async_trait]
impl PodKiller for SyncLoopKiller {
    async fn active_pods(&self) -> Vec<Pod> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.0.send(Control::ActivePods(tx)).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    async fn evict(&self, pod: &Pod, stopped: Stopped, grace: Duration) -> bool {
        let (done, rx) = tokio::sync::oneshot::channel();
        let msg = Control::Stop {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            stopped,
            grace,
            done,
        };
        if self.0.send(msg).await.is_err() {
            return false;
        }
        if tokio::time::timeout(POD_CLEANUP_TIMEOUT, rx).await.is_err() {
            tracing::info!(pod = %crate::podspec::full_name(pod), "eviction manager: timed out waiting for pods to be cleaned up");
        }
        true
    }
}

/// Container GC then image GC, for the eviction manager.
pub struct Reclaimers {
    pub containers: Arc<ContainerGc>,
    pub images: Arc<ImageGc>,
}

#[async_trait::async_trait]
impl NodeReclaim for Reclaimers {
    async fn delete_all_unused_containers(&self) -> Result<(), EvictionError> {
        self.containers
            .collect()
            .await
            .map(|_| ())
            .map_err(|e| EvictionError::Reclaim(e.to_string()))
    }

    async fn delete_unused_images(&self) -> Result<(), EvictionError> {
        self.images
            .delete_unused_images()
            .await
            .map(|_| ())
            .map_err(|e| EvictionError::Reclaim(e.to_string()))
    }
}

/// The node's allocatable memory: capacity less kube and system reservations and the hard
/// memory.available threshold (what upstream's `pods` cgroup is limited to).
pub fn allocatable_memory(cfg: &Config, capacity: i64) -> i128 {
    let r = &cfg.cm.resources;
    let hard = r
        .eviction
        .thresholds
        .iter()
        .find(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
        .map_or(0, |t| match t.value {
            Amount::Quantity(q) => q,
            Amount::Fraction(f) => (f64::from(f) * capacity as f64) as i128,
        });
    (i128::from(capacity)
        - i128::from(r.kube_reserved.memory_bytes)
        - i128::from(r.system_reserved.memory_bytes)
        - hard)
        .max(0)
}

/// A GC period from a test hook (`env`: [`crate::images::IMAGE_GC_PERIOD_ENV`] or
/// [`crate::runtime::CONTAINER_GC_PERIOD_ENV`]), if set (a warning says so; an unparsable value is
/// ignored with a warning).
fn test_gc_period(env: &str, what: &str, default: &str) -> Option<std::time::Duration> {
    let text = std::env::var(env).ok()?;
    match plumbing::duration::parse(&text) {
        Ok(d) if !d.is_zero() => {
            tracing::warn!(period = %text, "{env} (a test hook) is set: {what} runs every {text} instead of every {default}");
            Some(d)
        }
        _ => {
            tracing::warn!(value = %text, "{env} is not a positive duration: ignored");
            None
        }
    }
}

/// Spawns the three loops onto `tasks`.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    cfg: &Config,
    runtime: Arc<dyn Runtime>,
    stats: Arc<crate::stats::Provider>,
    control: mpsc::Sender<Control>,
    events: Arc<dyn EventRecorder>,
    state: Arc<PressureState>,
    pull_records: Option<Arc<crate::images::PullRecords>>,
    log_links: Arc<crate::logs::Links>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    let containers = Arc::new(ContainerGc {
        runtime: runtime.clone(),
        pods: Arc::new(SyncLoopPods(control.clone())),
        policy: cfg.runtime.container_gc.clone(),
        pod_logs_dir: cfg.pod_logs_dir.clone(),
        period: test_gc_period(
            crate::runtime::CONTAINER_GC_PERIOD_ENV,
            "container GC",
            "1m",
        )
        .unwrap_or(crate::runtime::CONTAINER_GC_PERIOD),
        links: log_links,
    });
    let mut image_gc = ImageGc::new(
        runtime,
        stats.clone(),
        cfg.images.image_gc.clone(),
        events.clone(),
        cfg.node.node_name.clone(),
        Some(
            cfg.images
                .pod_infra_container_image
                .clone()
                .unwrap_or_else(|| crate::images::DEFAULT_SANDBOX_IMAGE.to_string()),
        ),
    );
    if let Some(period) = test_gc_period(crate::images::IMAGE_GC_PERIOD_ENV, "image GC", "5m") {
        image_gc = image_gc.with_period(period);
    }
    if let Some(records) = pull_records {
        image_gc = image_gc.with_pull_records(records);
    }
    let images = Arc::new(image_gc);
    tasks.spawn(containers.clone().run(cancel.clone()));
    tasks.spawn(images.clone().run(cancel.clone()));
    let allocatable = cfg
        .cm
        .resources
        .enforces("pods")
        .then(|| allocatable_memory(cfg, crate::host::memory_capacity()));
    let manager = Manager::new(
        cfg.cm.resources.eviction.clone(),
        Parts {
            stats: Arc::new(ProviderStats(stats)),
            pods: Arc::new(SyncLoopKiller(control)),
            reclaim: Arc::new(Reclaimers { containers, images }),
            events,
            state,
            node_name: cfg.node.node_name.clone(),
            allocatable_memory: allocatable,
            pod_level_resources: cfg.cm.pod_limits.pod_level_resources,
        },
    );
    tasks.spawn(manager.run(cancel.clone()));
}
