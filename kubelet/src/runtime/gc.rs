//! Container garbage collection, as upstream's kuberuntime container GC (every minute, and on
//! demand from the eviction manager): dead containers beyond `maxPerPodContainer` per (pod,
//! container name) and beyond `maxContainers` on the node are removed oldest first, keeping
//! those younger than `minAge`; every dead container of a pod no source wants any more is
//! removed; sandboxes that are not ready and hold no container are removed, except the newest
//! one of a pod that still exists; the log directories (`/var/log/pods/<ns>_<name>_<uid>`) of
//! gone pods are removed. Nothing is taken as gone before every pod source has reported.
//!
//! The choices are pure ([`dead_containers_to_remove`], [`sandboxes_to_remove`],
//! [`log_dirs_to_remove`]); [`ContainerGc`] lists, decides and removes.

use super::{Container, ContainerState, Runtime, Sandbox, SandboxState};
use crate::config::gc::ContainerGcPolicy;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Upstream's ContainerGCPeriod.
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);
const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";

/// Errors of one collection.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Runtime(#[from] super::RuntimeError),
    #[error("failed to remove {what}: {message}")]
    Remove { what: String, message: String },
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

/// The sandboxes to remove: not ready and without containers (`remaining`: the containers
/// left after this collection); all such of a gone pod, all but the newest of a live one.
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
}

impl ContainerGc {
    /// Collects at start and then every [`CONTAINER_GC_PERIOD`] until cancelled (upstream's
    /// wait.Until).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        tracing::info!(policy = ?self.policy, "starting container garbage collection");
        loop {
            if let Err(e) = self.collect().await {
                tracing::error!(error = %e, "Container garbage collection failed");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(CONTAINER_GC_PERIOD) => {}
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
        for id in &doomed {
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
        let sandboxes = self.runtime.list_sandboxes().await?;
        for id in sandboxes_to_remove(&sandboxes, &remaining, known.as_ref()) {
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
