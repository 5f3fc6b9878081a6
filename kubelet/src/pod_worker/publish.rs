//! The pod's API status, computed from what was observed and handed to the status manager.

use super::*;

impl Worker {
    pub(super) fn publish(
        &mut self,
        obs: &Observed,
        waiting: BTreeMap<String, Waiting>,
        terminating: bool,
    ) {
        let mut readiness = BTreeMap::new();
        let mut not_started = Vec::new();
        for (name, id) in &self.probed {
            readiness.insert(id.clone(), self.env.probes.is_ready(&self.uid, name, id));
            if !self.env.probes.is_started(&self.uid, name, id) {
                not_started.push(name.clone());
            }
        }
        let sandbox_ready = obs
            .sandboxes
            .first()
            .is_some_and(|s| s.state == SandboxState::Ready);
        let o = Observation {
            containers: obs.containers.iter().map(|(_, c)| c).collect(),
            sandbox_ready,
            pod_ips: if sandbox_ready {
                self.sandbox_ips.1.clone()
            } else {
                Vec::new()
            },
            host_ips: self.env.node.host_ips.clone(),
            waiting,
            readiness,
            not_started,
            runtime_name: self.env.runtime_name.clone(),
            start_time: self.start_time,
            qos_class: self.qos().as_str().into(),
            terminating,
            evicted: self.stopped.as_ref().map(|s| Waiting {
                reason: s.reason.clone(),
                message: s.message.clone(),
            }),
        };
        let mut st = status::pod_status(&self.pod, &o, self.last_status.as_ref());
        self.resize_status(&mut st, obs);
        if let Some(dm) = &self.env.devices {
            dm.fill_allocated_resources_status(&self.uid, &mut st);
        }
        if let Some(s) = self.stopped.as_ref().filter(|s| s.disruption) {
            status::set_disruption_target(&mut st, &s.message);
        }
        self.note_started(&st);
        if self.last_status.as_ref() != Some(&st) {
            self.env.statuses.set(&self.pod, st.clone());
            self.last_status = Some(st);
        }
    }

    /// Puts each exited container's full message (runtime message + termination message or
    /// log tail) into `obs`, reading the files once per container instance.
    pub(super) async fn add_exit_messages(&mut self, obs: &mut Observed) {
        let todo: Vec<ContainerStatus> = obs
            .containers
            .iter()
            .map(|(_, c)| c)
            .filter(|c| {
                c.state == ContainerState::Exited && !self.term_messages.contains_key(&c.id)
            })
            .cloned()
            .collect();
        if !todo.is_empty() {
            let (node, uid) = (self.env.node.clone(), self.uid.clone());
            let log_dir = crate::node_settings::pod_log_dir(&self.env.node, &self.pod);
            let log_root = self.env.node.pod_logs_dir.clone();
            let read = tokio::task::spawn_blocking(move || {
                todo.into_iter()
                    .map(|c| {
                        let restart = plan::restart_count_of(&c);
                        let file = spec::termination_log_host_path(&node, &uid, &c.name, restart);
                        let log = log_dir.join(&c.name).join(format!("{restart}.log"));
                        (
                            c.id.clone(),
                            exit_message::exit_message(&c, &file, &log_root, &log),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .await;
            match read {
                Ok(read) => self.term_messages.extend(read),
                Err(e) => tracing::warn!(error = %e, "reading termination messages failed"),
            }
        }
        self.term_messages
            .retain(|id, _| obs.containers.iter().any(|(_, c)| c.id == *id));
        for (_, c) in &mut obs.containers {
            if let Some(m) = self.term_messages.get(&c.id) {
                c.message = m.clone();
            }
        }
    }

    /// Records the pod's start latency (first seen → every container running) once.
    pub(super) fn note_started(&mut self, st: &PodStatus) {
        let Some(seen) = self.first_seen else { return };
        let statuses = st.container_statuses.as_deref().unwrap_or_default();
        let all_running = !statuses.is_empty()
            && statuses
                .iter()
                .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        if all_running {
            let took = seen.elapsed();
            self.first_seen = None;
            if let Some(m) = &self.env.pod_start_duration {
                m.observe(took.as_secs_f64());
            }
            tracing::info!(
                pod_start_ms = took.as_secs_f64() * 1000.0,
                "all containers running"
            );
        }
    }
}
