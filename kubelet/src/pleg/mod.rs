//! Pod lifecycle event generator: relists the runtime every period, compares with the previous
//! relist and reports which pods changed (and which pods exist at all).

use crate::runtime::{ContainerState, LABEL_POD_UID, Runtime, SandboxState};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub mod evented;
pub use evented::EVENTED_PLEG_GATE;

/// How long the PLEG may go without a successful relist before it is unhealthy (upstream's
/// `genericPlegRelistThreshold`).
pub const GENERIC_RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// The outcome of one relist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Relist {
    /// Pods with a container or sandbox that appeared, changed state or vanished.
    pub changed: BTreeSet<String>,
    /// Every pod UID the runtime has anything for.
    pub present: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Container(ContainerState),
    Sandbox(bool),
}

/// Keeps the last snapshot and diffs new ones against it.
#[derive(Debug, Default)]
pub struct Pleg {
    last: BTreeMap<String, (String, Seen)>,
}

impl Pleg {
    /// One relist. Errors leave the snapshot untouched.
    pub async fn relist(&mut self, rt: &dyn Runtime) -> crate::runtime::Result<Relist> {
        let sandboxes = rt.list_sandboxes().await?;
        let containers = rt.list_containers().await?;
        let mut now = BTreeMap::new();
        for s in sandboxes {
            now.insert(
                s.id,
                (s.pod_uid, Seen::Sandbox(s.state == SandboxState::Ready)),
            );
        }
        for c in containers {
            let uid = c.labels.get(LABEL_POD_UID).cloned().unwrap_or_default();
            now.insert(c.id, (uid, Seen::Container(c.state)));
        }
        let mut out = Relist::default();
        for (id, (uid, seen)) in &now {
            if self.last.get(id).map(|(_, s)| s) != Some(seen) {
                out.changed.insert(uid.clone());
            }
        }
        for (id, (uid, _)) in &self.last {
            if !now.contains_key(id) {
                out.changed.insert(uid.clone());
            }
        }
        out.present = now
            .values()
            .map(|(u, _)| u.clone())
            .filter(|u| !u.is_empty())
            .collect();
        out.changed.remove("");
        self.last = now;
        Ok(out)
    }

    /// From the last snapshot: pods with a ready sandbox, and containers per state (upstream's
    /// `container_state` values created, running, exited, unknown; each always present).
    pub fn counts(&self) -> (usize, BTreeMap<&'static str, usize>) {
        let mut ready_pods = BTreeSet::new();
        let mut states: BTreeMap<&'static str, usize> = [
            ("created", 0),
            ("running", 0),
            ("exited", 0),
            ("unknown", 0),
        ]
        .into_iter()
        .collect();
        for (uid, seen) in self.last.values() {
            match seen {
                Seen::Sandbox(true) => {
                    ready_pods.insert(uid);
                }
                Seen::Sandbox(false) => {}
                Seen::Container(c) => {
                    let name = match c {
                        ContainerState::Created => "created",
                        ContainerState::Running => "running",
                        ContainerState::Exited => "exited",
                        ContainerState::Unknown => "unknown",
                    };
                    *states.entry(name).or_default() += 1;
                }
            }
        }
        (ready_pods.len(), states)
    }

    /// Sets `kubelet_running_pods` and `kubelet_running_containers{container_state}` from the
    /// last snapshot, as upstream's generic PLEG does after each relist.
    pub fn record_counts(&self, metrics: &crate::metrics::Metrics) {
        let (ready_pods, states) = self.counts();
        metrics.running_pods.set(ready_pods as f64);
        for (state, n) in states {
            metrics
                .running_containers
                .with_label_values(&[state])
                .set(n as f64);
        }
    }
}

/// Health of the relist loop: the unix time of the last successful relist, and how long it
/// may be ago.
#[derive(Debug, Default)]
pub struct PlegHealth {
    pub last_ok_unix: AtomicI64,
    /// Seconds; 0: [`GENERIC_RELIST_THRESHOLD`] (the evented PLEG sets its own).
    pub threshold_secs: AtomicI64,
}

impl PlegHealth {
    /// Upstream reports PLEG unhealthy when no relist succeeded for 3 minutes (10 with the
    /// evented PLEG's events flowing).
    pub fn healthy(&self, now_unix: i64) -> bool {
        let last = self.last_ok_unix.load(Ordering::Relaxed);
        let threshold = match self.threshold_secs.load(Ordering::Relaxed) {
            0 => GENERIC_RELIST_THRESHOLD.as_secs() as i64,
            t => t,
        };
        last > 0 && now_unix - last <= threshold
    }
}

/// Relists every `period` and sends each result. `evented` (the `EventedPLEG` gate): the
/// runtime's container events wake a relist at once and the period grows (see [`evented`]).
pub async fn run(
    rt: Arc<dyn Runtime>,
    period: Duration,
    evented: bool,
    tx: mpsc::Sender<Relist>,
    health: Arc<PlegHealth>,
    metrics: crate::metrics::Metrics,
    cancel: CancellationToken,
) {
    let mut events = evented.then(evented::Events::default);
    let mut pleg = Pleg::default();
    let mut failing = false;
    let mut last_start: Option<std::time::Instant> = None;
    loop {
        let started = std::time::Instant::now();
        if let Some(prev) = last_start.replace(started) {
            metrics
                .pleg_relist_interval
                .observe(started.duration_since(prev).as_secs_f64());
        }
        match pleg.relist(rt.as_ref()).await {
            Ok(r) => {
                metrics
                    .pleg_relist_duration
                    .observe(started.elapsed().as_secs_f64());
                metrics.pleg_last_seen.set(crate::clock::unix_now() as f64);
                pleg.record_counts(&metrics);
                health
                    .last_ok_unix
                    .store(crate::clock::unix_now(), Ordering::Relaxed);
                if failing {
                    tracing::info!("container runtime is reachable again");
                    failing = false;
                }
                if tx.send(r).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "relisting the container runtime failed; retrying every period");
                    failing = true;
                }
            }
        }
        let wait = events.as_ref().map_or(period, evented::Events::period);
        if let Some(e) = &events {
            health
                .threshold_secs
                .store(e.threshold().as_secs() as i64, Ordering::Relaxed);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = async {
                match events.as_mut() {
                    Some(e) => e.next(rt.as_ref()).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake::FakeRuntime;
    use crate::runtime::{ContainerConfig, LinuxResources, SandboxConfig};

    pub(super) fn sandbox(uid: &str) -> SandboxConfig {
        SandboxConfig {
            name: "p".into(),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
            hostname: "p".into(),
            log_directory: String::new(),
            dns: None,
            port_mappings: vec![],
            labels: [(LABEL_POD_UID.to_string(), uid.to_string())].into(),
            annotations: Default::default(),
            cgroup_parent: String::new(),
            host_network: false,
            host_pid: false,
            share_process_namespace: false,
            host_ipc: false,
            sysctls: Default::default(),
            security: Default::default(),
            resources: None,
            overhead: None,
            runtime_handler: String::new(),
            userns: None,
        }
    }

    pub(super) fn container(uid: &str) -> ContainerConfig {
        ContainerConfig {
            name: "c".into(),
            attempt: 0,
            image: "i".into(),
            command: vec![],
            args: vec![],
            working_dir: String::new(),
            envs: vec![],
            mounts: vec![],
            devices: vec![],
            cdi_devices: vec![],
            labels: [(LABEL_POD_UID.to_string(), uid.to_string())].into(),
            annotations: Default::default(),
            log_path: String::new(),
            stdin: false,
            stdin_once: false,
            tty: false,
            resources: LinuxResources::default(),
            security: Default::default(),
        }
    }

    #[tokio::test]
    async fn counts_ready_pods_and_containers_by_state_for_the_running_gauges() {
        let rt = FakeRuntime::new();
        let mut pleg = Pleg::default();
        let a = rt.run_sandbox(&sandbox("a")).await.unwrap();
        let b = rt.run_sandbox(&sandbox("b")).await.unwrap();
        let c1 = rt
            .create_container(&a, &container("a"), &sandbox("a"))
            .await
            .unwrap();
        rt.start_container(&c1).await.unwrap();
        rt.create_container(&a, &container("a"), &sandbox("a"))
            .await
            .unwrap();
        rt.stop_sandbox(&b).await.unwrap();
        pleg.relist(&rt).await.unwrap();
        let (pods, states) = pleg.counts();
        assert_eq!(pods, 1, "b's sandbox is not ready");
        assert_eq!(states["running"], 1);
        assert_eq!(states["created"], 1);
        assert_eq!(states["exited"], 0);
        assert_eq!(states.len(), 4);
    }

    #[tokio::test]
    async fn reports_changes_per_pod() {
        let rt = FakeRuntime::new();
        let mut pleg = Pleg::default();
        assert_eq!(pleg.relist(&rt).await.unwrap(), Relist::default());
        let sb = rt.run_sandbox(&sandbox("a")).await.unwrap();
        let sb_cfg = sandbox("a");
        let c = rt
            .create_container(&sb, &container("a"), &sb_cfg)
            .await
            .unwrap();
        let r = pleg.relist(&rt).await.unwrap();
        assert_eq!(r.changed, BTreeSet::from(["a".to_string()]));
        assert_eq!(r.present, BTreeSet::from(["a".to_string()]));
        // Nothing changed: nothing reported, but the pod is still present.
        let r = pleg.relist(&rt).await.unwrap();
        assert!(r.changed.is_empty());
        assert_eq!(r.present.len(), 1);
        rt.start_container(&c).await.unwrap();
        assert_eq!(pleg.relist(&rt).await.unwrap().changed.len(), 1);
        rt.remove_sandbox(&sb).await.unwrap();
        let r = pleg.relist(&rt).await.unwrap();
        assert_eq!(r.changed, BTreeSet::from(["a".to_string()]));
        assert!(r.present.is_empty());
    }

    #[test]
    fn health_window() {
        let h = PlegHealth::default();
        assert!(!h.healthy(1000));
        h.last_ok_unix.store(1000, Ordering::Relaxed);
        assert!(h.healthy(1100));
        assert!(!h.healthy(1181));
    }
}
