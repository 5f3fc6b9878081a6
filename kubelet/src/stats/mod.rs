//! The stats provider behind `/stats/summary` and `/metrics/resource` (and, later, eviction):
//! node CPU and memory from the root cgroup, pods and containers from one
//! `ListPodSandboxStats`, fs from statvfs(2) and `ImageFsInfo`, volumes and logs from walks on
//! the blocking pool. One refresh makes a fixed number of CRI calls whatever the number of
//! containers, and its result is served for [`DEFAULT_MAX_AGE`] (upstream's cAdvisor
//! housekeeping period), so scrapes never fan out into per-container calls.

pub mod build;
pub mod disk;
pub mod node;
pub mod resource;
pub mod summary;
#[cfg(test)]
mod tests;

use crate::runtime::Runtime;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use node::NodeSource;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long one refresh is served (upstream's cAdvisor housekeeping interval is 10 s).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(10);

/// Stats that could not be gathered.
#[derive(Debug, thiserror::Error, Clone)]
pub enum StatsError {
    #[error("listing pod sandbox stats: {0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error("stats refresh task failed: {0}")]
    Task(String),
}

/// Where the provider looks.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub node_name: String,
    /// The kubelet's root dir (node fs; pods' volumes under `pods/<uid>/volumes`).
    pub root_dir: PathBuf,
    /// `/var/log/pods`.
    pub pod_logs_dir: PathBuf,
    pub max_age: Duration,
}

/// One refresh's result.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken: Instant,
    pub summary: summary::Summary,
}

#[derive(Default)]
struct Cache {
    last: Option<Arc<Snapshot>>,
    cpu: build::CpuHistory,
}

/// The stats provider; see the module doc.
pub struct Provider {
    runtime: Arc<dyn Runtime>,
    node: Arc<dyn NodeSource>,
    cfg: ProviderConfig,
    cache: tokio::sync::Mutex<Cache>,
}

impl Provider {
    pub fn new(runtime: Arc<dyn Runtime>, node: Arc<dyn NodeSource>, cfg: ProviderConfig) -> Self {
        Self {
            runtime,
            node,
            cfg,
            cache: tokio::sync::Mutex::new(Cache::default()),
        }
    }

    /// The latest snapshot, refreshed when older than `max_age` (one refresh at a time:
    /// concurrent callers wait for it and share its result).
    pub async fn snapshot(&self) -> Result<Arc<Snapshot>, StatsError> {
        let mut cache = self.cache.lock().await;
        if let Some(s) = &cache.last
            && s.taken.elapsed() < self.cfg.max_age
        {
            return Ok(s.clone());
        }
        let raw = self.gather().await?;
        let summary = build::summary(&raw, &mut cache.cpu);
        let snap = Arc::new(Snapshot {
            taken: Instant::now(),
            summary,
        });
        cache.last = Some(snap.clone());
        Ok(snap)
    }

    async fn gather(&self) -> Result<build::Raw, StatsError> {
        let rt = &self.runtime;
        // A fixed set of calls per refresh, none per container.
        let (sandboxes, containers, listed, image_fs) = tokio::join!(
            rt.list_sandbox_stats(),
            rt.list_containers(),
            rt.list_sandboxes(),
            rt.image_fs_info()
        );
        let sandboxes = sandboxes?;
        let image_fs = match image_fs {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::warn!(error = %e, "ImageFsInfo failed; imageFs stats omitted");
                None
            }
        };
        let container_created = containers
            .map(|cs| cs.into_iter().map(|c| (c.id, c.created_at)).collect())
            .unwrap_or_default();
        let sandbox_created = listed
            .map(|ss| ss.into_iter().map(|s| (s.id, s.created_at)).collect())
            .unwrap_or_default();
        let node = self.node.clone();
        let cfg = self.cfg.clone();
        let image_mount = image_fs
            .as_ref()
            .and_then(|i| i.image_filesystems.first())
            .map(|f| PathBuf::from(&f.mountpoint));
        let pods: Vec<disk::PodDirs> = sandboxes
            .iter()
            .map(|s| disk::PodDirs {
                uid: s.uid.clone(),
                volumes: cfg.root_dir.join("pods").join(&s.uid).join("volumes"),
                logs: cfg
                    .pod_logs_dir
                    .join(format!("{}_{}_{}", s.namespace, s.name, s.uid)),
            })
            .collect();
        let blocking = tokio::task::spawn_blocking(move || {
            let now_ns = unix_now_ns();
            let usage = node.usage();
            let root_fs = node.fs_info(&cfg.root_dir);
            let image_cap = image_mount.and_then(|m| node.fs_info(&m));
            let disk = pods
                .iter()
                .map(|p| (p.uid.clone(), disk::pod_disk(p)))
                .collect();
            (
                now_ns,
                usage,
                node.boot_time(),
                root_fs,
                image_cap,
                node.pids(),
                disk,
            )
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?;
        let (now_ns, usage, boot_time, root_fs, image_fs_capacity, pids, disk) = blocking;
        Ok(build::Raw {
            node_name: self.cfg.node_name.clone(),
            now_ns,
            node: usage,
            boot_time,
            root_fs,
            image_fs_capacity,
            image_fs,
            pids,
            sandboxes,
            sandbox_created,
            container_created,
            disk,
        })
    }
}

/// The provider as the :10250 server holds it: set once the runtime is connected (the server
/// starts first); until then stats requests get 503.
#[derive(Clone, Default)]
pub struct Handle(Arc<OnceLock<Arc<Provider>>>);

impl Handle {
    pub fn set(&self, p: Arc<Provider>) {
        let _ = self.0.set(p);
    }

    pub fn get(&self) -> Option<&Arc<Provider>> {
        self.0.get()
    }

    async fn snapshot(&self) -> Result<Arc<Snapshot>, Response> {
        let Some(p) = self.get() else {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "stats provider not ready: the container runtime has not answered yet",
            )
                .into_response());
        };
        p.snapshot().await.map_err(|e| {
            tracing::warn!(error = %e, "stats summary failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Error: failed to get summary stats: {e}"),
            )
                .into_response()
        })
    }

    /// `GET /stats/summary`.
    pub async fn summary(&self) -> Response {
        match self.snapshot().await {
            Ok(s) => (
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string(&s.summary).unwrap_or_default(),
            )
                .into_response(),
            Err(r) => r,
        }
    }

    /// `GET /metrics/resource`: on a failed refresh the node's figures are missing and
    /// `scrape_error` is 1, as upstream.
    pub async fn resource_metrics(&self) -> Response {
        let text = match self.snapshot().await {
            Ok(s) => resource::render(&s.summary, false),
            Err(_) => resource::render(&summary::Summary::default(), true),
        };
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response()
    }
}

fn unix_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
