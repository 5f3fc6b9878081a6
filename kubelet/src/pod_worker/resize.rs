//! In-place resize of running containers (upstream's computePodResizeAction and
//! doPodResizeAction): a running container whose allocated cpu or memory differs from what it
//! runs with is changed with UpdateContainerResources, or restarted when its `resizePolicy`
//! says `RestartContainer` for a resource that changed. The pod cgroup follows: before the
//! containers when the pod grows, after them when it shrinks. A memory request alone changes
//! nothing in the cgroups (none has it), as upstream.

use super::*;
use crate::allocation::message;
use crate::podspec;
use k8s_openapi::api::core::v1::ResourceRequirements;

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
        self.actuated
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

    /// Resizes the running containers in place (after the plan's actions). Forgets the
    /// containers that are gone.
    pub(super) async fn resize_in_place(&mut self, obs: &Observed) {
        self.actuated
            .retain(|id, _| obs.containers.iter().any(|(_, c)| c.id == *id));
        let mut todo = Vec::new();
        let (mut grows, mut changed) = (false, false);
        for (c, id) in running(&self.pod, obs) {
            let with = self.running_with(&c, &id);
            if resize_of(&c, &with) == Resize::InPlace {
                let (want, have) = (
                    Amounts::of(&c.resources.clone().unwrap_or_default()),
                    Amounts::of(&with),
                );
                grows |= want.cpu_limit > have.cpu_limit
                    || want.cpu_request > have.cpu_request
                    || want.memory_limit > have.memory_limit;
                todo.push((c, id));
            }
        }
        if todo.is_empty() {
            if self.resize_error.take().is_some() {
                tracing::info!("resize done after an earlier failure");
            }
            return;
        }
        let sandbox = obs.sandboxes.first().map(|s| s.id.clone());
        if grows {
            self.update_pod_cgroup().await;
        }
        let rt = self.env.runtime.clone();
        for (c, id) in todo {
            let resources = spec::linux_resources(&self.env.node, &self.pod, &c);
            tracing::info!(container = %c.name, cpu_quota = resources.cpu_quota, cpu_shares = resources.cpu_shares, memory_limit = resources.memory_limit_in_bytes, "resizing container in place");
            match rt.update_container_resources(&id, &resources).await {
                Ok(()) => {
                    self.actuated
                        .insert(id, c.resources.clone().unwrap_or_default());
                    changed = true;
                }
                Err(e) => {
                    // Updates go in order; the next pass tries again.
                    tracing::warn!(container = %c.name, error = %e, "UpdateContainerResources failed");
                    self.resize_error = Some(e.to_string());
                    return;
                }
            }
        }
        self.resize_error = None;
        if !grows {
            self.update_pod_cgroup().await;
        }
        let text = message::resize_message(&self.pod, "Pod resize completed", "");
        self.event(None, EventType::Normal, message::COMPLETED, &text);
        if let (true, Some(sb)) = (changed, sandbox) {
            let overhead = spec::sandbox_overhead(&self.env.node, &self.pod);
            let resources = spec::sandbox_resources(&self.env.node, &self.pod);
            if let Err(e) = rt
                .update_sandbox_resources(&sb, &overhead, &resources)
                .await
            {
                tracing::warn!(error = %e, "UpdatePodSandboxResources failed");
            }
        }
    }

    /// Sets the pod cgroup's limits for the allocated pod (off the async workers).
    async fn update_pod_cgroup(&self) {
        let (cgroups, pod) = (self.env.cgroups.clone(), self.pod.clone());
        match tokio::task::spawn_blocking(move || cgroups.ensure_pod(&pod)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot resize the pod cgroup"),
            Err(e) => tracing::warn!(error = %e, "pod cgroup resize panicked"),
        }
    }

    /// Records what a container the worker just created runs with.
    pub(super) fn note_created(&mut self, id: &str, c: &K8sContainer) {
        self.actuated
            .insert(id.to_string(), c.resources.clone().unwrap_or_default());
    }

    /// The resize fields of the pod's status: each resizable container's
    /// `allocatedResources` and (running) `resources`, and the `PodResizePending` and
    /// `PodResizeInProgress` conditions.
    pub(super) fn resize_status(&mut self, st: &mut PodStatus, obs: &Observed) {
        let uid = self.uid.clone();
        let mut running_with = BTreeMap::new();
        let mut in_progress = self.resize_error.is_some();
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
                in_progress: in_progress.then(|| self.resize_error.clone()),
                generation: self.pod.metadata.generation,
            },
            self.last_status.as_ref(),
        );
    }
}

#[cfg(test)]
mod tests;
