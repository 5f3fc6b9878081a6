//! In-place resize of running containers (upstream's computePodResizeAction and
//! doPodResizeAction): a running container whose allocated cpu or memory differs from what it
//! runs with is changed with UpdateContainerResources, or restarted when its `resizePolicy`
//! says `RestartContainer` for a resource that changed. The pod cgroup follows per resource
//! (`steps.rs`): before the containers when the pod grows, after them when it shrinks. A
//! memory request alone changes nothing in the cgroups (none has it), as upstream.

use super::*;
use crate::allocation::message;
use crate::cm::{CgroupError, PodCgroupPart, PodCgroupValues};
use crate::podspec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Why a step of an in-place resize failed (the `PodResizeInProgress` condition's message).
#[derive(Debug, thiserror::Error)]
enum ResizeError {
    /// UpdateContainerResources failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The pod cgroup could not be read or written.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{what} panicked: {source}")]
    Panicked {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

mod steps;

/// `have` with `resource`'s requests and limits taken from `want`.
fn with_resource(
    have: &ResourceRequirements,
    want: &ResourceRequirements,
    resource: steps::Resource,
) -> ResourceRequirements {
    let name = match resource {
        steps::Resource::Memory => "memory",
        steps::Resource::Cpu => "cpu",
    };
    type List = Option<BTreeMap<String, Quantity>>;
    let take = |have: &List, want: &List| {
        let mut out = have.clone().unwrap_or_default();
        match want.as_ref().and_then(|w| w.get(name)) {
            Some(q) => out.insert(name.to_string(), q.clone()),
            None => out.remove(name),
        };
        (!out.is_empty()).then_some(out)
    };
    ResourceRequirements {
        limits: take(&have.limits, &want.limits),
        requests: take(&have.requests, &want.requests),
        claims: have.claims.clone(),
    }
}

/// The amounts a resize compares, in upstream's units (millicores, bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Amounts {
    pub cpu_limit: i128,
    pub cpu_request: i128,
    pub memory_limit: i128,
}

impl Amounts {
    pub fn of(r: &ResourceRequirements) -> Self {
        let get = |list: &Option<
            BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >,
                   name: &str| {
            list.as_ref()
                .and_then(|l| l.get(name))
                .and_then(|q| podspec::resources::amount(name, q))
                .unwrap_or(0)
        };
        Amounts {
            cpu_limit: get(&r.limits, "cpu"),
            cpu_request: get(&r.requests, "cpu"),
            memory_limit: get(&r.limits, "memory"),
        }
    }
}

/// What a running container needs for its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resize {
    None,
    /// UpdateContainerResources.
    InPlace,
    /// Kill and start again (`resizePolicy: RestartContainer` for a changed resource).
    Restart,
}

/// Upstream's decision for one container: `allocated` (the spec at its allocation) against
/// what it runs with.
pub(super) fn resize_of(c: &K8sContainer, running_with: &ResourceRequirements) -> Resize {
    let want = Amounts::of(&c.resources.clone().unwrap_or_default());
    let have = Amounts::of(running_with);
    if want == have {
        return Resize::None;
    }
    let restarts = |resource: &str| {
        c.resize_policy
            .iter()
            .flatten()
            .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
    };
    let cpu_changed = want.cpu_limit != have.cpu_limit || want.cpu_request != have.cpu_request;
    let memory_changed = want.memory_limit != have.memory_limit;
    if (cpu_changed && restarts("cpu")) || (memory_changed && restarts("memory")) {
        Resize::Restart
    } else {
        Resize::InPlace
    }
}

/// The newest running instance of each resizable container in the ready sandbox:
/// (container spec at its allocation, instance ID).
fn running(pod: &Pod, obs: &Observed) -> Vec<(K8sContainer, String)> {
    let Some(sb) = obs
        .sandboxes
        .first()
        .filter(|s| s.state == SandboxState::Ready)
    else {
        return Vec::new();
    };
    crate::allocation::resizable(pod)
        .filter_map(|c| {
            let s = obs.newest(&c.name, Some(&sb.id))?;
            (s.state == ContainerState::Running).then(|| (c.clone(), s.id.clone()))
        })
        .collect()
}

impl Worker {
    /// What each running container runs with; one this worker did not start (adopted after
    /// an agent restart) is taken to run with its checkpointed allocation.
    fn running_with(&mut self, c: &K8sContainer, id: &str) -> ResourceRequirements {
        self.resized
            .actuated
            .entry(id.to_string())
            .or_insert_with(|| c.resources.clone().unwrap_or_default())
            .clone()
    }

    /// The running containers a resize restarts (their IDs), for the plan.
    pub(super) fn resize_restarts(&mut self, obs: &Observed) -> HashSet<String> {
        let mut out = HashSet::new();
        for (c, id) in running(&self.pod, obs) {
            let with = self.running_with(&c, &id);
            if resize_of(&c, &with) == Resize::Restart {
                tracing::info!(container = %c.name, "resize requires a restart");
                out.insert(id);
            }
        }
        out
    }

    /// Resizes the running containers in place (after the plan's actions), ordered against
    /// the pod cgroup as [`steps`] says; the first write that fails stops the pass (the
    /// `PodResizeInProgress` condition says why) and the next pass goes on from what was
    /// done. Forgets the containers that are gone.
    pub(super) async fn resize_in_place(&mut self, obs: &Observed) {
        self.resized
            .actuated
            .retain(|id, _| obs.containers.iter().any(|(_, c)| c.id == *id));
        let mut todo = Vec::new();
        for (c, id) in running(&self.pod, obs) {
            let with = self.running_with(&c, &id);
            if resize_of(&c, &with) == Resize::InPlace {
                todo.push((c, id));
            }
        }
        // After a failed pass the pod cgroup may still be behind its containers.
        if todo.is_empty() && self.resized.error.is_none() {
            return;
        }
        let changes: Vec<(Amounts, Amounts)> = todo
            .iter()
            .map(|(c, id)| {
                let want = Amounts::of(&c.resources.clone().unwrap_or_default());
                (want, Amounts::of(&self.resized.actuated[id]))
            })
            .collect();
        let (now, wanted) = match self.pod_cgroup_values().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pod cgroup for a resize");
                self.resized.error = Some(e.to_string());
                return;
            }
        };
        let order = steps::steps(now, wanted, &changes);
        if !order.is_empty() {
            tracing::info!(steps = ?order, "resizing in place");
        }
        for step in order {
            let done = match step {
                steps::Step::Pod(part) => self.set_pod_value(part).await,
                steps::Step::Container(i, resource) => {
                    let (c, id) = &todo[i];
                    self.update_container(c, id, resource).await
                }
            };
            if let Err(e) = done {
                // The rest waits: nothing may go above its parent; the next pass retries.
                self.resized.error = Some(e.to_string());
                return;
            }
        }
        if self.resized.error.take().is_some() && todo.is_empty() {
            tracing::info!("resize done after an earlier failure");
        }
        if todo.is_empty() {
            return;
        }
        let text = message::resize_message(&self.pod, "Pod resize completed", "");
        self.event(None, EventType::Normal, message::COMPLETED, &text);
        if let Some(sb) = obs.sandboxes.first() {
            let overhead = spec::sandbox_overhead(&self.env.node, &self.pod);
            let resources = spec::sandbox_resources(&self.env.node, &self.pod);
            if let Err(e) = self
                .env
                .runtime
                .update_sandbox_resources(&sb.id, &overhead, &resources)
                .await
            {
                tracing::warn!(error = %e, "UpdatePodSandboxResources failed");
            }
        }
    }

    /// UpdateContainerResources for `resource` at its allocation, the other resource at what
    /// the container runs with (upstream's updatePodContainerResources); on success the
    /// container runs with that.
    async fn update_container(
        &mut self,
        c: &K8sContainer,
        id: &str,
        resource: steps::Resource,
    ) -> Result<(), ResizeError> {
        let want = c.resources.clone().unwrap_or_default();
        let next = with_resource(&self.resized.actuated[id], &want, resource);
        let mut at = c.clone();
        at.resources = Some(next.clone());
        let resources = spec::linux_resources(&self.env.node, &self.pod, &at);
        tracing::info!(container = %c.name, ?resource, cpu_quota = resources.cpu_quota, cpu_shares = resources.cpu_shares, memory_limit = resources.memory_limit_in_bytes, "resizing container in place");
        match self
            .env
            .runtime
            .update_container_resources(id, &resources)
            .await
        {
            Ok(()) => {
                self.resized.actuated.insert(id.to_string(), next);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(container = %c.name, error = %e, "UpdateContainerResources failed");
                Err(ResizeError::Runtime(e))
            }
        }
    }

    /// The pod cgroup's values now and those of the allocated pod (off the async workers).
    async fn pod_cgroup_values(
        &self,
    ) -> Result<(Option<PodCgroupValues>, PodCgroupValues), ResizeError> {
        let (cgroups, pod) = (self.env.cgroups.clone(), self.pod.clone());
        let read = move || {
            let now = cgroups.pod_values(&pod)?;
            Ok::<_, CgroupError>((now, cgroups.wanted_pod_values(&pod)))
        };
        match tokio::task::spawn_blocking(read).await {
            Ok(r) => Ok(r?),
            Err(e) => Err(ResizeError::Panicked {
                what: "reading the pod cgroup",
                source: e,
            }),
        }
    }

    /// Writes one value of the allocated pod to its cgroup (off the async workers).
    async fn set_pod_value(&self, part: PodCgroupPart) -> Result<(), ResizeError> {
        let (cgroups, pod) = (self.env.cgroups.clone(), self.pod.clone());
        match tokio::task::spawn_blocking(move || cgroups.set_pod_value(&pod, part)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, ?part, "cannot resize the pod cgroup");
                Err(ResizeError::Cgroup(e))
            }
            Err(e) => Err(ResizeError::Panicked {
                what: "pod cgroup resize",
                source: e,
            }),
        }
    }

    /// Records what a container the worker just created runs with.
    pub(super) fn note_created(&mut self, id: &str, c: &K8sContainer) {
        self.resized
            .actuated
            .insert(id.to_string(), c.resources.clone().unwrap_or_default());
    }

    /// The resize fields of the pod's status: each resizable container's
    /// `allocatedResources` and (running) `resources`, and the `PodResizePending` and
    /// `PodResizeInProgress` conditions.
    pub(super) fn resize_status(&mut self, st: &mut PodStatus, obs: &Observed) {
        let uid = self.uid.clone();
        let mut running_with = BTreeMap::new();
        let mut in_progress = self.resized.error.is_some();
        for (c, id) in running(&self.pod, obs) {
            let with = self.running_with(&c, &id);
            in_progress |= resize_of(&c, &with) != Resize::None;
            running_with.insert(c.name.clone(), with);
        }
        let allocated = self.env.allocations.get(&uid);
        status::resize::apply(
            st,
            &status::resize::ResizeView {
                allocated: allocated.as_ref(),
                running_with,
                pending: self.env.allocations.pending(&uid).as_ref(),
                in_progress: in_progress.then(|| self.resized.error.clone()),
                generation: self.pod.metadata.generation,
            },
            self.seen.last_status.as_ref(),
        );
    }
}

#[cfg(test)]
mod tests;
