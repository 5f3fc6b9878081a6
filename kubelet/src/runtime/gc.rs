//! Container garbage collection, as upstream's kuberuntime container GC (every minute, and on
//! demand from the eviction manager): dead containers beyond `maxPerPodContainer` per (pod,
//! container name) and beyond `maxContainers` on the node are removed oldest first, keeping
//! those younger than `minAge`; every dead container of a pod no source wants any more is
//! removed; sandboxes that are not ready and hold no container are removed (stopped first, as
//! upstream, in case nobody did), except the newest one of a pod that still exists; a pod's old
//! sandbox that still holds the dead container kept for it stays with it. The log directories (`/var/log/pods/<ns>_<name>_<uid>`) of
//! gone pods are removed. Nothing is taken as gone before every pod source has reported.
//! A container's log files (the current and rotated ones) and its log link
//! (`/var/log/containers`, [`LogLinks`]) go before the container, as upstream's
//! removeContainerLog (a failure keeps the container for the next collection); then
//! dangling links are swept.
//!
//! The choices are pure ([`dead_containers_to_remove`], [`sandboxes_to_remove`],
//! [`log_dirs_to_remove`]); [`ContainerGc`] lists, decides and removes.

use super::{Container, ContainerState, Runtime, Sandbox, SandboxState};
/// Upstream's container GC policy (kubecontainer.GCPolicy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerGcPolicy {
    /// Dead containers younger than this are kept.
    #[serde(with = "duration::serde_opt_plain")]
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); negative: no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    pub max_containers: i32,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use plumbing::duration;
use serde::Serialize;

/// Upstream's ContainerGCPeriod.
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// Test hook: a Go duration replacing [`CONTAINER_GC_PERIOD`] (the e2e tests cannot wait a
/// minute for the second collection). Not a setting: the agent warns when it is set.
pub const PERIOD_ENV: &str = "KUBELET_TEST_CONTAINER_GC_PERIOD";
const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";

/// Errors of one collection.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Runtime(#[from] super::RuntimeError),
    #[error("failed to remove {what}: {message}")]
    Remove { what: String, message: String },
}

/// Why a container's log link could not be removed (the logs subsystem's error).
pub type LinkError = Box<dyn std::error::Error + Send + Sync>;

/// The containers' log links in `/var/log/containers` (the logs subsystem implements it).
#[async_trait::async_trait]
pub trait LogLinks: Send + Sync {
    /// Before container `c` is removed: its log files (current and rotated, found through
    /// the runtime's ContainerStatus) and its link go. An error keeps the container for the
    /// next collection (upstream's removeContainerLog).
    async fn remove_logs(&self, runtime: &dyn Runtime, c: &Container) -> Result<(), LinkError>;
    /// After the removals: the dangling links of containers not in `containers` or exited
    /// go; how many went.
    async fn sweep_links(&self, containers: &[&Container]) -> usize;
}

/// Which pods still exist (the sync loop's workers); None until every source has reported.
#[async_trait::async_trait]
pub trait PodsKnown: Send + Sync {
    async fn known_pods(&self) -> Option<HashSet<String>>;
}

fn pod_uid(labels: &BTreeMap<String, String>) -> &str {
    labels.get(LABEL_POD_UID).map_or("", String::as_str)
}

/// The dead containers to remove, oldest first within each rule.
pub fn dead_containers_to_remove(
    containers: &[Container],
    known: Option<&HashSet<String>>,
    policy: &ContainerGcPolicy,
    now_ns: i64,
) -> Vec<String> {
    // Evict units: (pod UID, container name) → dead containers, newest first.
    let mut units: BTreeMap<(String, String), Vec<&Container>> = BTreeMap::new();
    let min_age = policy.min_age.as_nanos() as i64;
    for c in containers {
        if c.state == ContainerState::Running || now_ns - c.created_at < min_age {
            continue;
        }
        units
            .entry((pod_uid(&c.labels).to_string(), c.name.clone()))
            .or_default()
            .push(c);
    }
    for list in units.values_mut() {
        list.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    }
    let mut out = Vec::new();
    if let Some(known) = known {
        units.retain(|(uid, _), list| {
            if known.contains(uid) {
                return true;
            }
            out.extend(list.iter().map(|c| c.id.clone()));
            false
        });
    }
    let mut keep_per_unit = |units: &mut BTreeMap<_, Vec<&Container>>, keep: usize| {
        for list in units.values_mut() {
            if list.len() > keep {
                out.extend(list.drain(keep..).rev().map(|c| c.id.clone()));
            }
        }
    };
    if policy.max_per_pod_container >= 0 {
        keep_per_unit(&mut units, policy.max_per_pod_container as usize);
    }
    let total: usize = units.values().map(Vec::len).sum();
    if policy.max_containers >= 0 && total > policy.max_containers as usize {
        // Leave an even share per unit (at least one), then the newest overall.
        let share = (policy.max_containers as usize / units.len().max(1)).max(1);
        keep_per_unit(&mut units, share);
        let mut rest: Vec<&Container> = units.values().flatten().copied().collect();
        if rest.len() > policy.max_containers as usize {
            rest.sort_by_key(|c| std::cmp::Reverse(c.created_at));
            out.extend(
                rest[policy.max_containers as usize..]
                    .iter()
                    .rev()
                    .map(|c| c.id.clone()),
            );
        }
    }
    out
}

/// The sandboxes to remove, as upstream's evictSandboxes: not ready and without containers
/// (`remaining`: the containers left after this collection); all such of a gone pod; of a
/// live one, all but its newest sandbox (which stays even when not ready: the pod worker
/// replaces it).
pub fn sandboxes_to_remove(
    sandboxes: &[Sandbox],
    remaining: &[&Container],
    known: Option<&HashSet<String>>,
) -> Vec<String> {
    let with_containers: HashSet<&str> = remaining.iter().map(|c| c.sandbox_id.as_str()).collect();
    let mut by_pod: BTreeMap<&str, Vec<&Sandbox>> = BTreeMap::new();
    for s in sandboxes {
        by_pod.entry(s.pod_uid.as_str()).or_default().push(s);
    }
    let mut out = Vec::new();
    for (uid, mut list) in by_pod {
        list.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let gone = known.is_some_and(|k| !k.contains(uid));
        let skip = if gone { 0 } else { 1 };
        for s in list.into_iter().skip(skip) {
            let active = s.state == SandboxState::Ready || with_containers.contains(s.id.as_str());
            if !active {
                out.push(s.id.clone());
            }
        }
    }
    out
}

/// Pod log directories (`<ns>_<name>_<uid>`) of pods that are gone.
pub fn log_dirs_to_remove(dirs: &[String], known: &HashSet<String>) -> Vec<String> {
    dirs.iter()
        .filter(|d| {
            d.rsplit_once('_')
                .is_some_and(|(_, uid)| !uid.is_empty() && !known.contains(uid))
        })
        .cloned()
        .collect()
}

/// The container garbage collector; see the module doc.
pub struct ContainerGc {
    pub runtime: Arc<dyn Runtime>,
    pub pods: Arc<dyn PodsKnown>,
    pub policy: ContainerGcPolicy,
    /// `/var/log/pods`.
    pub pod_logs_dir: PathBuf,
    /// How often it collects ([`CONTAINER_GC_PERIOD`]).
    pub period: Duration,
    /// The containers' log links: removed with them, dangling ones swept.
    pub links: Arc<dyn LogLinks>,
}

impl ContainerGc {
    /// Collects at start and then every `period` until cancelled (upstream's wait.Until).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        tracing::info!(policy = ?self.policy, "starting container garbage collection");
        loop {
            if let Err(e) = self.collect().await {
                tracing::error!(error = %e, "Container garbage collection failed");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.period) => {}
            }
        }
    }

    /// One collection (also upstream's DeleteAllUnusedContainers for the eviction manager).
    pub async fn collect(&self) -> Result<usize, GcError> {
        let known = self.pods.known_pods().await;
        let containers = self.runtime.list_containers().await?;
        let doomed = dead_containers_to_remove(
            &containers,
            known.as_ref(),
            &self.policy,
            crate::clock::unix_now_ns(),
        );
        let mut removed = 0;
        let mut failed = Vec::new();
        let by_id: BTreeMap<&str, &Container> =
            containers.iter().map(|c| (c.id.as_str(), c)).collect();
        for id in &doomed {
            if let Some(c) = by_id.get(id.as_str())
                && let Err(e) = self.links.remove_logs(self.runtime.as_ref(), c).await
            {
                failed.push(format!("container {id}: {e}"));
                continue;
            }
            match self.runtime.remove_container(id).await {
                Ok(()) => removed += 1,
                Err(super::RuntimeError::NotFound { .. }) => {}
                Err(e) => failed.push(format!("container {id}: {e}")),
            }
        }
        let gone: HashSet<&str> = doomed.iter().map(String::as_str).collect();
        let remaining: Vec<&Container> = containers
            .iter()
            .filter(|c| !gone.contains(c.id.as_str()))
            .collect();
        self.links.sweep_links(&remaining).await;
        let sandboxes = self.runtime.list_sandboxes().await?;
        for id in sandboxes_to_remove(&sandboxes, &remaining, known.as_ref()) {
            // A sandbox whose processes died with nobody to stop it still holds its network
            // (containerd refuses to remove it): stop it first, as upstream.
            match self.runtime.stop_sandbox(&id).await {
                Ok(()) | Err(super::RuntimeError::NotFound { .. }) => {}
                Err(e) => {
                    failed.push(format!("stopping sandbox {id}: {e}"));
                    continue;
                }
            }
            match self.runtime.remove_sandbox(&id).await {
                Ok(()) => removed += 1,
                Err(super::RuntimeError::NotFound { .. }) => {}
                Err(e) => failed.push(format!("sandbox {id}: {e}")),
            }
        }
        if let Some(known) = known {
            let dir = self.pod_logs_dir.clone();
            let work = move || -> Vec<String> {
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    return Vec::new();
                };
                let names: Vec<String> = rd
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect();
                let mut errs = Vec::new();
                for name in log_dirs_to_remove(&names, &known) {
                    if let Err(e) = std::fs::remove_dir_all(dir.join(&name)) {
                        errs.push(format!("log dir {name}: {e}"));
                    }
                }
                errs
            };
            match tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(work))
                .await
            {
                Ok(Ok(errs)) => failed.extend(errs),
                Ok(Err(e)) => failed.push(format!("log dirs: {e}")),
                Err(_) => failed.push("log dirs: timed out".into()),
            }
        }
        if let Some(first) = failed.first() {
            return Err(GcError::Remove {
                what: format!("{} objects", failed.len()),
                message: first.clone(),
            });
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::SandboxConfig;

    fn c(id: &str, uid: &str, name: &str, created: i64, state: ContainerState) -> Container {
        Container {
            id: id.into(),
            sandbox_id: format!("sb-{uid}"),
            name: name.into(),
            attempt: 0,
            image: String::new(),
            image_ref: String::new(),
            state,
            created_at: created,
            labels: [(LABEL_POD_UID.to_string(), uid.to_string())].into(),
            annotations: BTreeMap::new(),
        }
    }

    use ContainerState::{Exited, Running};

    #[test]
    fn keeps_one_dead_container_per_pod_container_and_never_running_ones() {
        let list = vec![
            c("run", "a", "web", 40, Running),
            c("d3", "a", "web", 30, Exited),
            c("d2", "a", "web", 20, Exited),
            c("d1", "a", "web", 10, Exited),
            c("s1", "a", "side", 15, Exited),
        ];
        let known: HashSet<String> = ["a".to_string()].into();
        let p = ContainerGcPolicy::default();
        assert_eq!(
            dead_containers_to_remove(&list, Some(&known), &p, 100),
            ["d1", "d2"]
        );
        // Younger than minAge: kept.
        let young = ContainerGcPolicy {
            min_age: Duration::from_nanos(75),
            ..p.clone()
        };
        assert_eq!(
            dead_containers_to_remove(&list, Some(&known), &young, 100),
            ["d1"]
        );
        // A gone pod loses every dead container; before sources reported, nothing is gone.
        assert_eq!(
            dead_containers_to_remove(&list, Some(&HashSet::new()), &p, 100),
            ["s1", "d3", "d2", "d1"]
        );
        assert_eq!(
            dead_containers_to_remove(&list, None, &p, 100),
            ["d1", "d2"]
        );
    }

    #[test]
    fn max_containers_keeps_the_newest_on_the_node() {
        let list = vec![
            c("a2", "a", "x", 50, Exited),
            c("a1", "a", "x", 10, Exited),
            c("b2", "b", "y", 40, Exited),
            c("b1", "b", "y", 30, Exited),
            c("c1", "c", "z", 20, Exited),
        ];
        let known: HashSet<String> = ["a", "b", "c"].map(String::from).into();
        let p = ContainerGcPolicy {
            min_age: Duration::ZERO,
            max_per_pod_container: -1,
            max_containers: 2,
        };
        // Share 2/3 → 1 per unit (a1, b1 go), then the 2 newest of a2, b2, c1 stay.
        assert_eq!(
            dead_containers_to_remove(&list, Some(&known), &p, 100),
            ["a1", "b1", "c1"]
        );
    }

    fn sb(id: &str, uid: &str, created: i64, ready: bool) -> Sandbox {
        Sandbox {
            id: id.into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: uid.into(),
            attempt: 0,
            state: if ready {
                SandboxState::Ready
            } else {
                SandboxState::NotReady
            },
            created_at: created,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn sandboxes_without_containers_go_but_a_live_pod_keeps_its_newest() {
        let sandboxes = vec![
            sb("a-old", "a", 1, false),
            sb("a-new", "a", 2, false),
            sb("b-ready", "b", 1, true),
            sb("gone-1", "g", 1, false),
            sb("gone-2", "g", 2, false),
            sb("held", "h", 1, false),
            sb("held-2", "h", 2, false),
        ];
        let holder = c("x", "h", "x", 1, Exited);
        let mut holder = holder;
        holder.sandbox_id = "held".into();
        let known: HashSet<String> = ["a", "b", "h"].map(String::from).into();
        let out = sandboxes_to_remove(&sandboxes, &[&holder], Some(&known));
        assert_eq!(out, ["a-old", "gone-2", "gone-1"]);
    }

    struct Known(HashSet<String>);

    /// Records the link calls; `fail` makes every removal fail.
    #[derive(Default)]
    struct RecordLinks {
        removed: std::sync::Mutex<Vec<String>>,
        swept_with: std::sync::Mutex<Vec<Vec<String>>>,
        fail: bool,
    }

    #[async_trait::async_trait]
    impl LogLinks for RecordLinks {
        async fn remove_logs(&self, _: &dyn Runtime, c: &Container) -> Result<(), LinkError> {
            if self.fail {
                return Err("read-only file system".into());
            }
            self.removed.lock().unwrap().push(c.id.clone());
            Ok(())
        }
        async fn sweep_links(&self, containers: &[&Container]) -> usize {
            let ids = containers.iter().map(|c| c.id.clone()).collect();
            self.swept_with.lock().unwrap().push(ids);
            0
        }
    }

    /// A dead container of a gone pod: its log link goes before it, and the sweep sees only
    /// the containers left. When the link cannot go, the container stays for the next round.
    #[tokio::test]
    async fn a_removed_containers_link_goes_first_and_the_sweep_sees_what_is_left() {
        use crate::runtime::fake::FakeRuntime;
        let rt = Arc::new(FakeRuntime::new());
        let dir = tempfile::tempdir().unwrap();
        let mut ids = Vec::new();
        for pod in ["gone", "kept"] {
            let cfg: SandboxConfig = crate::runtime::raw::sandbox(0, pod, dir.path(), "");
            let sb = rt.run_sandbox(&cfg).await.unwrap();
            let ctr = crate::runtime::raw::container(&cfg);
            let c = rt.create_container(&sb, &ctr, &cfg).await.unwrap();
            rt.start_container(&c).await.unwrap();
            ids.push((cfg.uid.clone(), c));
        }
        rt.stop_container(&ids[0].1, Duration::ZERO).await.unwrap();
        let known: HashSet<String> = [ids[1].0.clone()].into();
        for fail in [true, false] {
            let links = Arc::new(RecordLinks {
                fail,
                ..Default::default()
            });
            let gc = ContainerGc {
                runtime: rt.clone(),
                pods: Arc::new(Known(known.clone())),
                policy: ContainerGcPolicy::default(),
                pod_logs_dir: dir.path().join("logs"),
                period: CONTAINER_GC_PERIOD,
                links: links.clone(),
            };
            let result = gc.collect().await;
            let listed: Vec<String> = rt
                .list_containers()
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.id)
                .collect();
            if fail {
                assert!(result.is_err(), "a failed link removal is reported");
                assert!(
                    listed.contains(&ids[0].1),
                    "the container stays: {listed:?}"
                );
            } else {
                assert!(!listed.contains(&ids[0].1), "{listed:?}");
                assert_eq!(*links.removed.lock().unwrap(), [ids[0].1.clone()]);
                assert_eq!(*links.swept_with.lock().unwrap(), [vec![ids[1].1.clone()]]);
            }
        }
    }

    #[async_trait::async_trait]
    impl PodsKnown for Known {
        async fn known_pods(&self) -> Option<HashSet<String>> {
            Some(self.0.clone())
        }
    }

    /// The node: pod `a`'s sandbox was stopped behind the agent's back and the agent
    /// made a new one. The old one keeps the dead instance GC keeps for `app`, so it stays (as
    /// upstream's); pod `b`'s old sandbox holds nothing and goes, stopped first.
    #[tokio::test]
    async fn an_old_sandbox_goes_once_it_holds_no_container_and_is_stopped_first() {
        use crate::runtime::fake::FakeRuntime;
        let rt = Arc::new(FakeRuntime::new());
        let dir = tempfile::tempdir().unwrap();
        let mut sandbox_of = BTreeMap::new();
        let mut known = HashSet::new();
        for pod in ["a", "b"] {
            let cfg: SandboxConfig = crate::runtime::raw::sandbox(0, pod, dir.path(), "");
            known.insert(cfg.uid.clone());
            let ctr = crate::runtime::raw::container(&cfg);
            let mut ids = Vec::new();
            for _ in 0..2 {
                let sb = rt.run_sandbox(&cfg).await.unwrap();
                let c = rt.create_container(&sb, &ctr, &cfg).await.unwrap();
                rt.start_container(&c).await.unwrap();
                ids.push((sb, c));
                if ids.len() == 1 {
                    rt.stop_sandbox(&ids[0].0).await.unwrap();
                }
            }
            sandbox_of.insert(pod, ids);
        }
        // Pod b's dead container was removed (by hand, or the runtime lost it).
        rt.remove_container(&sandbox_of["b"][0].1).await.unwrap();
        let gc = ContainerGc {
            runtime: rt.clone(),
            pods: Arc::new(Known(known)),
            policy: ContainerGcPolicy::default(),
            pod_logs_dir: dir.path().join("logs"),
            period: CONTAINER_GC_PERIOD,
            links: Arc::new(RecordLinks::default()),
        };
        rt.clear_calls();
        assert_eq!(gc.collect().await.unwrap(), 1);
        let left: Vec<String> = rt
            .list_sandboxes()
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        let (a, b) = (&sandbox_of["a"], &sandbox_of["b"]);
        assert!(
            left.contains(&a[0].0),
            "a's old sandbox holds its dead container"
        );
        assert!(!left.contains(&b[0].0), "b's old sandbox holds nothing");
        assert!(left.contains(&a[1].0) && left.contains(&b[1].0));
        let calls: Vec<String> = rt
            .calls()
            .into_iter()
            .filter(|c| c.contains("PodSandbox") && c != "ListPodSandbox")
            .collect();
        assert_eq!(calls, ["StopPodSandbox", "RemovePodSandbox"]);
        // Once a's old instance is no longer the one kept (a newer one died), both go.
        rt.exit_container(&a[1].1, 1);
        assert_eq!(gc.collect().await.unwrap(), 2);
        let left = rt.list_sandboxes().await.unwrap();
        assert!(left.iter().all(|s| s.id != a[0].0), "{left:?}");
    }

    #[test]
    fn log_dirs_of_gone_pods() {
        let known: HashSet<String> = ["u1".to_string()].into();
        let dirs = vec![
            "ns_a_u1".to_string(),
            "ns_b_u2".to_string(),
            "junk".to_string(),
        ];
        assert_eq!(log_dirs_to_remove(&dirs, &known), ["ns_b_u2"]);
    }
}
