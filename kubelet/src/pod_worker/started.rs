//! What a pass created, so that the status after a start pass is read from the runtime
//! without listing the pod again: the new sandbox (its status was read for the pod IPs) and
//! one `ContainerStatus` per container created. Every other pass lists the pod's sandboxes
//! and containers again ([`observe`]).

use super::*;

/// The sandbox and containers one pass created.
#[derive(Debug, Default)]
pub(super) struct Created {
    /// The sandbox made this pass, as the runtime reported it after RunPodSandbox.
    pub sandbox: Option<Sandbox>,
    /// (sandbox ID, container ID) of each container created this pass, in order.
    pub containers: Vec<(String, String)>,
}

/// The listed form of a sandbox made this pass, from its config and the status read after
/// RunPodSandbox.
pub(super) fn created_sandbox(cfg: &SandboxConfig, status: &SandboxStatus) -> Sandbox {
    Sandbox {
        id: status.id.clone(),
        pod_name: cfg.name.clone(),
        pod_namespace: cfg.namespace.clone(),
        pod_uid: cfg.uid.clone(),
        attempt: cfg.attempt,
        state: status.state,
        created_at: status.created_at,
        labels: cfg.labels.clone(),
        annotations: cfg.annotations.clone(),
    }
}

impl Worker {
    /// The pod in the runtime after `p` was carried out on `obs`. A pass whose actions only
    /// created the sandbox and started containers knows what it changed and reads only
    /// that; any other pass (stops, removals, a sandbox that could not be made) lists the
    /// pod again, as does a failed read.
    pub(super) async fn observe_after(&mut self, obs: Observed, p: &Plan) -> Observed {
        let created = std::mem::take(&mut self.starts.created);
        let rt = self.env.runtime.clone();
        let only_starts = p.actions.iter().all(|a| {
            matches!(
                a,
                Action::CreateSandbox { .. }
                    | Action::StartInitContainer { .. }
                    | Action::StartContainer { .. }
                    | Action::StartEphemeralContainer { .. }
            )
        });
        let wants_sandbox = p
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreateSandbox { .. }));
        if !only_starts || (wants_sandbox && created.sandbox.is_none()) {
            return observe(rt.as_ref(), &self.uid).await.unwrap_or(obs);
        }
        let mut after = Observed {
            sandboxes: obs.sandboxes.clone(),
            containers: obs.containers.clone(),
            not_started: HashSet::new(),
            resize_restart: HashSet::new(),
        };
        if let Some(sb) = created.sandbox {
            after.sandboxes.insert(0, sb);
            after
                .sandboxes
                .sort_by_key(|s| std::cmp::Reverse(s.created_at));
        }
        let ids = created.containers.into_iter();
        if add_statuses(rt.as_ref(), ids, &mut after.containers)
            .await
            .is_err()
        {
            return observe(rt.as_ref(), &self.uid).await.unwrap_or(obs);
        }
        after
    }
}

/// Adds the status of each (sandbox ID, container ID) to `containers` (one gone meanwhile is
/// left out) and keeps them newest first.
pub(super) async fn add_statuses(
    rt: &dyn Runtime,
    ids: impl Iterator<Item = (String, String)>,
    containers: &mut Vec<(String, ContainerStatus)>,
) -> Result<()> {
    for (sandbox_id, id) in ids {
        match rt.container_status(&id).await {
            Ok(s) => containers.push((sandbox_id, s)),
            Err(RuntimeError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    containers.sort_by_key(|c| std::cmp::Reverse(c.1.created_at));
    Ok(())
}
