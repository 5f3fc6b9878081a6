//! Probe wiring: start probe workers for running containers, take their results, kill a
//! container whose liveness or startup probe failed.

use super::*;

impl Worker {
    /// Starts probes for containers that began running and tells the manager about exits.
    pub(super) fn update_probes(&mut self, obs: &Observed) {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let sandbox = obs
            .sandboxes
            .first()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| s.id.as_str());
        let pod_ref = ::probes::PodRef {
            uid: self.uid.clone(),
            name: self.pod.metadata.name.clone().unwrap_or_default(),
            namespace: self.pod.metadata.namespace.clone().unwrap_or_default(),
        };
        // Sidecars are probed like app containers (regular init containers are not).
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| is_sidecar(c));
        for c in sidecars.chain(spec.containers.iter()) {
            // A container that never restarts stops being probed once it exits.
            let never = !is_sidecar(c) && !pod::container_restartable(c, &spec);
            let Some(latest) = obs.newest(&c.name, sandbox) else {
                continue;
            };
            let known = self.probing.probed.get(&c.name) == Some(&latest.id);
            match latest.state {
                ContainerState::Running if !known => {
                    let Ok(specs) = ::probes::ContainerProbes::from_container(c) else {
                        continue;
                    };
                    if specs.is_empty() {
                        continue;
                    }
                    let started = std::time::UNIX_EPOCH
                        + Duration::from_nanos(latest.started_at.max(0) as u64);
                    self.env.probes.add_container(
                        &pod_ref,
                        ::probes::ContainerRef {
                            name: c.name.clone(),
                            id: latest.id.clone(),
                            started_at: ::probes::instant_from_system_time(started),
                        },
                        specs,
                        self.seen
                            .sandbox_ips
                            .1
                            .first()
                            .map(String::as_str)
                            .unwrap_or(""),
                        self.env.exec.clone(),
                    );
                    self.probing
                        .probed
                        .insert(c.name.clone(), latest.id.clone());
                }
                ContainerState::Exited if known => {
                    if never {
                        self.env.probes.remove_container(&self.uid, &c.name);
                        self.probing.probed.remove(&c.name);
                    } else {
                        self.env.probes.container_exited(&self.uid, &c.name);
                    }
                }
                _ => {}
            }
        }
    }

    /// A probe result changed. Liveness and startup failures kill the container (it restarts
    /// per the restart policy); readiness changes only show in the next status.
    pub(super) fn on_probe(&mut self, u: ::probes::ProbeUpdate) {
        if u.kind == ::probes::ProbeKind::Readiness || u.result != ::probes::ProbeStatus::Failure {
            return;
        }
        if self.probing.probed.get(&u.container_name) != Some(&u.container_id) {
            return;
        }
        let grace = u
            .termination_grace_period_seconds
            .map(pod::kill_grace)
            .unwrap_or_else(|| self.grace());
        tracing::info!(
            container = %u.container_name,
            probe = u.kind.as_str(),
            message = %u.message,
            "Container failed {} probe, will be restarted",
            u.kind.as_str().to_lowercase()
        );
        self.probing
            .kills
            .push((u.container_id, u.container_name, u.kind, grace));
    }

    pub(super) async fn kill_for_probes(&mut self, obs: &Observed) -> bool {
        let kills = std::mem::take(&mut self.probing.kills);
        let mut any = false;
        for (id, name, kind, grace) in kills {
            let running = obs
                .containers
                .iter()
                .any(|(_, c)| c.id == id && c.state == ContainerState::Running);
            if running {
                let message = format!(
                    "Container {name} failed {} probe, will be restarted",
                    kind.as_str().to_lowercase()
                );
                self.kill_container(&id, &name, grace, Some(&message)).await;
                any = true;
            }
        }
        any
    }
}
