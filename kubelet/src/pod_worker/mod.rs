//! One worker per pod UID. Each pass is level-triggered: observe the pod's sandboxes and
//! containers in the runtime, plan the difference to the spec ([`plan`], a pure function), act,
//! then publish the pod's status. A pod being removed is stopped with its grace period and
//! every trace of it (containers, sandbox, cgroup, directories) is removed.

use crate::cgroups::{CgroupNamer, Cgroups};
use crate::events::{EventRecorder, EventType};
use crate::pod::{self, Qos};
use crate::runtime::*;
use crate::spec::{self, NodeSettings};
use crate::status::{self, Observation, Waiting};
use crate::status_manager::StatusManager;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Container as K8sContainer, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// CrashLoopBackOff: first restart at once, then 10 s doubling up to 5 min (upstream).
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A container that ran this long before exiting starts its back-off afresh.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// Upstream never kills with less than 2 s of grace, even when asked for 0.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// What every worker shares.
pub struct Env {
    pub runtime: Arc<dyn Runtime>,
    pub cgroups: Arc<dyn Cgroups>,
    pub namer: CgroupNamer,
    pub node: NodeSettings,
    /// `containerd` in `containerd://<id>`.
    pub runtime_name: String,
    pub statuses: Arc<StatusManager>,
    /// Pulling, Pulled, Created, Started, Killing, BackOff, ... events.
    pub events: Arc<dyn EventRecorder>,
    /// Liveness, readiness and startup probes of every container.
    pub probes: Arc<probes::ProbeManager>,
    /// How exec probes reach the runtime.
    pub exec: Arc<dyn probes::ExecRunner>,
    /// `kubelet_pod_start_duration_seconds`, when metrics are kept.
    pub pod_start_duration: Option<prometheus::Histogram>,
    /// Held while pulling when `serializeImagePulls` is on.
    pub pull_lock: tokio::sync::Mutex<()>,
    pub resync: Duration,
    /// Bind mounts for subPath volume mounts.
    pub binder: Arc<dyn crate::volume::subpath::Binder>,
}

/// Messages from the sync loop to a worker.
#[derive(Debug)]
pub enum Msg {
    /// The desired spec (same UID) changed.
    Update(Box<Pod>),
    /// Stop the pod with this grace period (seconds) and remove it.
    Terminate(i64),
    /// Something changed in the runtime: sync now.
    Wake,
    /// A probe result changed.
    Probe(Box<probes::ProbeUpdate>),
}

/// Per-container-name restart back-off.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    entries: HashMap<String, BackoffEntry>,
}

#[derive(Debug, Clone)]
struct BackoffEntry {
    exit_id: String,
    restart_at: Instant,
    delay: Duration,
    next: Duration,
}

impl Backoff {
    /// For a container instance `exit_id` that exited and should restart: `Ok(())` when it may
    /// restart now, `Err(remaining, current delay)` while backing off.
    pub fn check(
        &mut self,
        name: &str,
        exit_id: &str,
        ran_for: Duration,
        now: Instant,
    ) -> Result<(), (Duration, Duration)> {
        let entry = self
            .entries
            .entry(name.to_string())
            .or_insert(BackoffEntry {
                exit_id: String::new(),
                restart_at: now,
                delay: Duration::ZERO,
                next: Duration::ZERO,
            });
        if entry.exit_id != exit_id {
            // A new exit: schedule the restart after the current back-off, then double it.
            if ran_for >= BACKOFF_RESET_AFTER {
                entry.next = Duration::ZERO;
            }
            entry.exit_id = exit_id.to_string();
            entry.delay = entry.next;
            entry.restart_at = now + entry.next;
            entry.next = if entry.next.is_zero() {
                BACKOFF_INITIAL
            } else {
                (entry.next * 2).min(BACKOFF_MAX)
            };
        }
        if now >= entry.restart_at {
            Ok(())
        } else {
            Err((entry.restart_at - now, entry.delay))
        }
    }
}

/// The runtime's view of one pod.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Newest first.
    pub sandboxes: Vec<Sandbox>,
    /// Newest first. Paired with their sandbox IDs.
    pub containers: Vec<(String, ContainerStatus)>,
}

impl Observed {
    fn newest<'a>(&'a self, name: &str, sandbox: Option<&str>) -> Option<&'a ContainerStatus> {
        self.containers
            .iter()
            .filter(|(sb, c)| c.name == name && sandbox.is_none_or(|s| s == sb))
            .map(|(_, c)| c)
            .next()
    }
}

/// A container to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub name: String,
    pub init: bool,
    pub restart_count: u32,
}

/// What one pass decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Stop every container and the current sandbox.
    pub kill_pod: bool,
    /// Create a sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    /// Containers to stop (ID, name) before starting replacements.
    pub kill: Vec<(String, String)>,
    /// Dead instances to remove (older than the last two per name, or never started).
    pub remove: Vec<String>,
    pub start: Vec<Start>,
    /// Waiting reasons for containers that are not started now.
    pub waiting: BTreeMap<String, Waiting>,
    pub wake_after: Option<Duration>,
}

fn restart_count_of(c: &ContainerStatus) -> u32 {
    c.annotations
        .get(ANN_RESTART_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn ran_for(c: &ContainerStatus) -> Duration {
    Duration::from_nanos((c.finished_at - c.started_at).max(0) as u64)
}

fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Always" => true,
        "OnFailure" => exit_code != 0,
        _ => false,
    }
}

/// `name_namespace(uid)`, as upstream prints pods in back-off messages.
fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

/// Decides what to do for `pod` given what the runtime has. Pure apart from the back-off table.
pub fn plan(pod: &Pod, obs: &Observed, backoff: &mut Backoff, now: Instant) -> Plan {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let inits: Vec<&K8sContainer> = spec.init_containers.iter().flatten().collect();
    let mut p = Plan::default();

    // Garbage: keep the newest two instances of each name.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (_, c) in &obs.containers {
        let n = seen.entry(c.name.as_str()).or_default();
        *n += 1;
        if *n > 2 && c.state == ContainerState::Exited {
            p.remove.push(c.id.clone());
        }
    }

    let sandbox = obs.sandboxes.first();
    let ready = sandbox.filter(|s| s.state == SandboxState::Ready);
    let next_count = |name: &str| {
        obs.newest(name, None)
            .map(|c| restart_count_of(c) + 1)
            .unwrap_or(0)
    };
    let Some(sandbox) = ready else {
        // No usable sandbox: a new one, unless the pod has run and must not restart.
        let attempt = sandbox.map(|s| s.attempt + 1).unwrap_or(0);
        if sandbox.is_some() {
            p.kill_pod = obs
                .containers
                .iter()
                .any(|(_, c)| c.state == ContainerState::Running);
        }
        if policy == "Never" && attempt != 0 && !obs.containers.is_empty() {
            return p;
        }
        let to_start: Vec<Start> = if let Some(first) = inits.first() {
            vec![Start {
                name: first.name.clone(),
                init: true,
                restart_count: next_count(&first.name),
            }]
        } else {
            spec.containers
                .iter()
                .filter(|c| {
                    !(policy == "OnFailure"
                        && obs
                            .newest(&c.name, None)
                            .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0))
                })
                .map(|c| Start {
                    name: c.name.clone(),
                    init: false,
                    restart_count: next_count(&c.name),
                })
                .collect()
        };
        if to_start.is_empty() {
            return p;
        }
        p.kill_pod = sandbox.is_some();
        p.create_sandbox = Some(attempt);
        p.start = to_start;
        return p;
    };
    let sb = Some(sandbox.id.as_str());

    // Init containers run one at a time, in order; each must succeed before the next.
    for c in &inits {
        match obs.newest(&c.name, sb) {
            None => {
                p.start.push(Start {
                    name: c.name.clone(),
                    init: true,
                    restart_count: next_count(&c.name),
                });
                return p;
            }
            Some(s) if s.state == ContainerState::Running => return p,
            Some(s) if s.state == ContainerState::Exited && s.exit_code == 0 => continue,
            Some(s) if s.state == ContainerState::Exited => {
                if policy == "Never" {
                    p.kill_pod = true;
                    return p;
                }
                restart_or_wait(&mut p, backoff, pod, c, s, now);
                return p;
            }
            Some(s) => {
                p.remove.push(s.id.clone());
                p.start.push(Start {
                    name: c.name.clone(),
                    init: true,
                    restart_count: restart_count_of(s),
                });
                return p;
            }
        }
    }

    let mut running = 0;
    for c in &spec.containers {
        match obs.newest(&c.name, sb) {
            None => p.start.push(Start {
                name: c.name.clone(),
                init: false,
                restart_count: next_count(&c.name),
            }),
            Some(s) if s.state == ContainerState::Running => {
                if s.annotations
                    .get(ANN_CONTAINER_HASH)
                    .is_some_and(|h| *h != pod::container_hash(c))
                {
                    // The spec changed: replace the container.
                    p.kill.push((s.id.clone(), c.name.clone()));
                    p.start.push(Start {
                        name: c.name.clone(),
                        init: false,
                        restart_count: restart_count_of(s) + 1,
                    });
                } else {
                    running += 1;
                }
            }
            Some(s) if s.state == ContainerState::Exited => {
                if should_restart(policy, s.exit_code) {
                    restart_or_wait(&mut p, backoff, pod, c, s, now);
                }
            }
            Some(s) => {
                // Created but never started (a failed start): clear it and try again.
                p.remove.push(s.id.clone());
                p.start.push(Start {
                    name: c.name.clone(),
                    init: false,
                    restart_count: restart_count_of(s),
                });
            }
        }
    }
    if running == 0 && p.start.is_empty() && p.waiting.is_empty() {
        // Every container is done for good: the sandbox goes too.
        p.kill_pod = true;
    }
    p
}

fn restart_or_wait(
    p: &mut Plan,
    backoff: &mut Backoff,
    pod: &Pod,
    c: &K8sContainer,
    s: &ContainerStatus,
    now: Instant,
) {
    match backoff.check(&c.name, &s.id, ran_for(s), now) {
        Ok(()) => p.start.push(Start {
            name: c.name.clone(),
            init: false,
            restart_count: restart_count_of(s) + 1,
        }),
        Err((remaining, delay)) => {
            p.waiting.insert(
                c.name.clone(),
                Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: format!(
                        "back-off {} restarting failed container={} pod={}",
                        crate::duration::format(delay),
                        c.name,
                        pod_ref(pod)
                    ),
                },
            );
            p.wake_after = Some(p.wake_after.map_or(remaining, |w| w.min(remaining)));
        }
    }
}

/// Reads the pod's sandboxes and containers from the runtime, newest first.
pub async fn observe(rt: &dyn Runtime, uid: &str) -> Result<Observed> {
    let mut sandboxes: Vec<Sandbox> = rt
        .list_sandboxes()
        .await?
        .into_iter()
        .filter(|s| s.pod_uid == uid)
        .collect();
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed: Vec<Container> = rt
        .list_containers()
        .await?
        .into_iter()
        .filter(|c| c.labels.get(LABEL_POD_UID).map(String::as_str) == Some(uid))
        .collect();
    let mut containers = Vec::with_capacity(listed.len());
    for c in listed {
        match rt.container_status(&c.id).await {
            Ok(s) => containers.push((c.sandbox_id, s)),
            Err(RuntimeError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    containers.sort_by_key(|c| std::cmp::Reverse(c.1.created_at));
    Ok(Observed {
        sandboxes,
        containers,
    })
}

/// Image back-off state, per image.
#[derive(Debug, Default)]
struct PullBackoff {
    until: HashMap<String, (Instant, Duration)>,
}

/// The state a worker keeps between passes.
pub struct Worker {
    env: Arc<Env>,
    pod: Pod,
    uid: String,
    backoff: Backoff,
    pulls: PullBackoff,
    /// Errors from the last attempt to start each container.
    errors: BTreeMap<String, Waiting>,
    start_time: Option<Timestamp>,
    last_status: Option<PodStatus>,
    sandbox_ips: (String, Vec<String>),
    /// Container name → the instance whose probes are running.
    probed: HashMap<String, String>,
    /// Containers to kill because a liveness or startup probe failed: (id, grace).
    /// Containers to kill after a liveness/startup failure: (ID, name, probe kind, grace).
    probe_kills: Vec<(String, String, probes::ProbeKind, Duration)>,
    /// When this worker first saw the pod, until every container has run once.
    first_seen: Option<std::time::Instant>,
}

impl Worker {
    pub fn new(env: Arc<Env>, pod: Pod, previous: Option<PodStatus>) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let start_time = previous
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0);
        Self {
            env,
            pod,
            uid,
            backoff: Backoff::default(),
            pulls: PullBackoff::default(),
            errors: BTreeMap::new(),
            start_time,
            last_status: previous,
            sandbox_ips: (String::new(), Vec::new()),
            probed: HashMap::new(),
            probe_kills: Vec::new(),
            first_seen: Some(std::time::Instant::now()),
        }
    }

    /// Records an event about the pod, or about one of its containers.
    fn event(&self, container: Option<&str>, event_type: EventType, reason: &str, message: &str) {
        let object = match container {
            Some(c) => crate::events::container_ref(&self.pod, c),
            None => crate::events::pod_ref(&self.pod),
        };
        self.env.events.record(&object, event_type, reason, message);
    }

    fn qos(&self) -> Qos {
        pod::qos_class(&self.pod.spec.clone().unwrap_or_default())
    }

    fn sandbox_config(&self, attempt: u32) -> SandboxConfig {
        let parent = self.env.namer.pod_parent(self.qos(), &self.uid);
        spec::sandbox_config(&self.env.node, &self.pod, attempt, parent)
    }

    /// One level-triggered pass. Returns when to come back (at the latest).
    pub async fn sync(&mut self) -> Duration {
        let rt = self.env.runtime.clone();
        let obs = match observe(rt.as_ref(), &self.uid).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot observe pod in the runtime; will retry");
                return Duration::from_secs(1);
            }
        };
        let now = Instant::now();
        let killed_for_probes = self.kill_for_probes(&obs).await;
        let obs = if killed_for_probes {
            observe(rt.as_ref(), &self.uid).await.unwrap_or(obs)
        } else {
            obs
        };
        let p = plan(&self.pod, &obs, &mut self.backoff, now);
        let acted = p.kill_pod
            || p.create_sandbox.is_some()
            || !p.start.is_empty()
            || !p.kill.is_empty()
            || !p.remove.is_empty();
        for (name, w) in &p.waiting {
            if w.reason == "CrashLoopBackOff" {
                let message = format!(
                    "Back-off restarting failed container {name} in pod {}",
                    pod_ref(&self.pod)
                );
                self.event(Some(name), EventType::Warning, "BackOff", &message);
            }
        }
        let mut wake = p.wake_after;
        let grace = self.grace();
        if p.kill_pod {
            tracing::info!("stopping pod's containers and sandbox");
            self.stop_containers(&obs, grace).await;
            if let Some(sb) = obs.sandboxes.first()
                && let Err(e) = rt.stop_sandbox(&sb.id).await
            {
                tracing::warn!(error = %e, sandbox = %sb.id, "StopPodSandbox failed");
            }
        }
        for (id, name) in &p.kill {
            tracing::info!(container = %name, "container spec changed, will be restarted");
            self.event(
                Some(name),
                EventType::Normal,
                "Killing",
                &format!("Container {name} definition changed, will be restarted"),
            );
            let _ = rt.stop_container(id, grace).await;
        }
        for id in &p.remove {
            if let Err(e) = rt.remove_container(id).await {
                tracing::debug!(error = %e, container = %id, "RemoveContainer failed");
            }
        }
        let mut sandbox = obs
            .sandboxes
            .first()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| (s.id.clone(), s.attempt));
        if let Some(attempt) = p.create_sandbox {
            match self.create_sandbox(attempt).await {
                Ok(id) => sandbox = Some((id, attempt)),
                Err(e) => {
                    tracing::warn!(error = %e, "FailedCreatePodSandBox");
                    self.event(
                        None,
                        EventType::Warning,
                        "FailedCreatePodSandBox",
                        &format!("Failed to create pod sandbox: {e}"),
                    );
                    for s in &p.start {
                        self.errors.insert(
                            s.name.clone(),
                            Waiting {
                                reason: "ContainerCreating".into(),
                                message: format!("Failed to create pod sandbox: {e}"),
                            },
                        );
                    }
                    sandbox = None;
                    wake = Some(Duration::from_secs(2));
                }
            }
        }
        if let Some((sandbox_id, attempt)) = &sandbox {
            if self.sandbox_ips.0 != *sandbox_id {
                let ips = rt
                    .sandbox_status(sandbox_id)
                    .await
                    .map(|s| s.ips)
                    .unwrap_or_default();
                self.sandbox_ips = (sandbox_id.clone(), ips);
            }
            let sandbox_cfg = self.sandbox_config(*attempt);
            for s in &p.start {
                match self.start_container(sandbox_id, &sandbox_cfg, s).await {
                    Ok(()) => {
                        self.errors.remove(&s.name);
                    }
                    Err((w, retry)) => {
                        tracing::warn!(container = %s.name, reason = %w.reason, message = %w.message, "cannot start container");
                        // Image errors carry their reason ("Error: ErrImagePull"); the others
                        // the runtime's message, as upstream.
                        let detail = if w.reason.contains("Image") {
                            &w.reason
                        } else {
                            &w.message
                        };
                        self.event(
                            Some(&s.name),
                            EventType::Warning,
                            "Failed",
                            &format!("Error: {detail}"),
                        );
                        self.errors.insert(s.name.clone(), w);
                        wake = Some(wake.map_or(retry, |x| x.min(retry)));
                        // Init containers run in order: stop at the first failure.
                        if s.init {
                            break;
                        }
                    }
                }
            }
        }
        let obs = if acted {
            observe(rt.as_ref(), &self.uid).await.unwrap_or(obs)
        } else {
            obs
        };
        let mut waiting = self.errors.clone();
        waiting.extend(p.waiting.clone());
        self.update_probes(&obs);
        self.publish(&obs, waiting, false);
        wake.unwrap_or(self.env.resync).min(self.env.resync)
    }

    fn grace(&self) -> Duration {
        let g = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Duration::from_secs(g.max(0) as u64).max(MIN_GRACE)
    }

    async fn stop_containers(&self, obs: &Observed, grace: Duration) {
        let rt = &self.env.runtime;
        let stops = obs
            .containers
            .iter()
            .filter(|(_, c)| c.state == ContainerState::Running)
            .map(|(_, c)| async move {
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Killing",
                    &format!("Stopping container {}", c.name),
                );
                tracing::info!(container = %c.name, grace_seconds = grace.as_secs(), "Killing container with a grace period");
                if let Err(e) = rt.stop_container(&c.id, grace).await {
                    tracing::warn!(container = %c.name, error = %e, "StopContainer failed");
                }
            });
        futures::future::join_all(stops).await;
    }

    async fn create_sandbox(&mut self, attempt: u32) -> Result<String, String> {
        let cfg = self.sandbox_config(attempt);
        if let Some(path) = self.env.namer.pod_path(self.qos(), &self.uid)
            && let Err(e) = self.env.cgroups.create(&path)
        {
            tracing::warn!(error = %e, "cannot create pod cgroup; the runtime will create it");
        }
        std::fs::create_dir_all(&cfg.log_directory)
            .map_err(|e| format!("creating {}: {e}", cfg.log_directory))?;
        let id = self
            .env
            .runtime
            .run_sandbox(&cfg)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(sandbox = %id, attempt, "sandbox started");
        self.start_time.get_or_insert_with(Timestamp::now);
        Ok(id)
    }

    /// Pulls if needed, creates and starts one container. On failure: the waiting reason and
    /// when to retry.
    async fn start_container(
        &mut self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        s: &Start,
    ) -> Result<(), (Waiting, Duration)> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let c = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == s.name)
            .cloned()
            .expect("planned containers come from the spec");
        let wait = |reason: &str, message: String, retry: Duration| {
            (
                Waiting {
                    reason: reason.into(),
                    message,
                },
                retry,
            )
        };
        if let Err(e) = probes::ContainerProbes::from_container(&c) {
            return Err(wait(
                "CreateContainerConfigError",
                format!("invalid probe: {e}"),
                Duration::from_secs(30),
            ));
        }
        self.ensure_image(&c, sandbox).await?;
        // Volume directories, /etc/hosts, subPath mounts and the log directory touch the
        // disk: off the async workers.
        let (env, pod, container) = (self.env.clone(), self.pod.clone(), c.clone());
        let (restart_count, pod_ips) = (s.restart_count, self.sandbox_ips.1.clone());
        let log_dir = std::path::Path::new(&sandbox.log_directory).join(&c.name);
        let prepared = tokio::task::spawn_blocking(move || {
            let volumes = spec::prepare_volumes(&env.node, &pod)?;
            let hosts = spec::write_etc_hosts(&env.node, &pod, &pod_ips)
                .map_err(|e| spec::ConfigError(e.to_string()))?;
            let cfg = spec::container_config(
                &env.node,
                &pod,
                &container,
                restart_count,
                &pod_ips,
                &volumes,
                hosts.as_deref(),
                env.binder.as_ref(),
            )?;
            let _ = std::fs::create_dir_all(&log_dir);
            Ok::<_, spec::ConfigError>(cfg)
        })
        .await
        .unwrap_or_else(|e| Err(spec::ConfigError(format!("preparing the container: {e}"))));
        let cfg = prepared
            .map_err(|e| wait("CreateContainerConfigError", e.0, Duration::from_secs(10)))?;
        let rt = &self.env.runtime;
        let id = rt
            .create_container(sandbox_id, &cfg, sandbox)
            .await
            .map_err(|e| {
                wait(
                    "CreateContainerError",
                    e.to_string(),
                    Duration::from_secs(10),
                )
            })?;
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Created",
            "Container created",
        );
        rt.start_container(&id)
            .await
            .map_err(|e| wait("RunContainerError", e.to_string(), Duration::from_secs(10)))?;
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Started",
            "Container started",
        );
        tracing::info!(container = %c.name, id = %id, restart_count = s.restart_count, "Started container");
        Ok(())
    }

    async fn ensure_image(
        &mut self,
        c: &K8sContainer,
        sandbox: &SandboxConfig,
    ) -> Result<(), (Waiting, Duration)> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| pod::default_pull_policy(&image).into());
        let wait = |reason: &str, message: String, retry: Duration| {
            (
                Waiting {
                    reason: reason.into(),
                    message,
                },
                retry,
            )
        };
        let present = self.env.runtime.image_status(&image).await.map_err(|e| {
            wait(
                "ErrImageInspect",
                format!("Failed to inspect image {image:?}: {e}"),
                Duration::from_secs(5),
            )
        })?;
        let name = c.name.as_str();
        let already_present = || {
            self.event(
                Some(name),
                EventType::Normal,
                "Pulled",
                &format!(
                    "Container image {image:?} already present on machine and can be accessed by the pod"
                ),
            )
        };
        match policy.as_str() {
            "Never" if present.is_none() => {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                self.event(
                    Some(name),
                    EventType::Warning,
                    "ErrImageNeverPull",
                    &message,
                );
                return Err(wait("ErrImageNeverPull", message, Duration::from_secs(10)));
            }
            "Never" => {
                already_present();
                return Ok(());
            }
            "IfNotPresent" if present.is_some() => {
                already_present();
                return Ok(());
            }
            _ => {}
        }
        let now = Instant::now();
        if let Some((until, _)) = self.pulls.until.get(&image)
            && now < *until
        {
            let message = format!("Back-off pulling image {image:?}");
            self.event(Some(name), EventType::Normal, "BackOff", &message);
            return Err(wait("ImagePullBackOff", message, *until - now));
        }
        tracing::info!(%image, "Pulling image");
        self.event(
            Some(name),
            EventType::Normal,
            "Pulling",
            &format!("Pulling image {image:?}"),
        );
        let waited = std::time::Instant::now();
        let guard = self.env.pull_lock.lock().await;
        let pulling = std::time::Instant::now();
        let result = self.env.runtime.pull_image(&image, sandbox).await;
        drop(guard);
        match result {
            Ok(_) => {
                self.pulls.until.remove(&image);
                tracing::info!(%image, "Successfully pulled image");
                let size = match self.env.runtime.image_status(&image).await {
                    Ok(Some(i)) => i.size,
                    _ => 0,
                };
                // Go's Duration printing, truncated to milliseconds as upstream does.
                let ms = |d: Duration| {
                    crate::duration::format(Duration::from_millis(d.as_millis() as u64))
                };
                let message = format!(
                    "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {size} bytes.",
                    ms(pulling.elapsed()),
                    ms(waited.elapsed()),
                );
                self.event(Some(name), EventType::Normal, "Pulled", &message);
                Ok(())
            }
            Err(e) => {
                let delay = self
                    .pulls
                    .until
                    .get(&image)
                    .map(|(_, d)| (*d * 2).min(BACKOFF_MAX))
                    .unwrap_or(BACKOFF_INITIAL);
                self.pulls.until.insert(image.clone(), (now + delay, delay));
                self.event(
                    Some(name),
                    EventType::Warning,
                    "Failed",
                    &format!("Failed to pull image {image:?}: {e}"),
                );
                Err(wait(
                    "ErrImagePull",
                    format!("failed to pull image {image:?}: {e}"),
                    delay,
                ))
            }
        }
    }

    /// Starts probes for containers that began running and tells the manager about exits.
    fn update_probes(&mut self, obs: &Observed) {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let sandbox = obs
            .sandboxes
            .first()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| s.id.as_str());
        let pod_ref = probes::PodRef {
            uid: self.uid.clone(),
            name: self.pod.metadata.name.clone().unwrap_or_default(),
            namespace: self.pod.metadata.namespace.clone().unwrap_or_default(),
        };
        let never = spec.restart_policy.as_deref() == Some("Never");
        for c in &spec.containers {
            let Some(latest) = obs.newest(&c.name, sandbox) else {
                continue;
            };
            let known = self.probed.get(&c.name) == Some(&latest.id);
            match latest.state {
                ContainerState::Running if !known => {
                    let Ok(specs) = probes::ContainerProbes::from_container(c) else {
                        continue;
                    };
                    if specs.is_empty() {
                        continue;
                    }
                    let started = std::time::UNIX_EPOCH
                        + Duration::from_nanos(latest.started_at.max(0) as u64);
                    self.env.probes.add_container(
                        &pod_ref,
                        probes::ContainerRef {
                            name: c.name.clone(),
                            id: latest.id.clone(),
                            started_at: probes::instant_from_system_time(started),
                        },
                        specs,
                        self.sandbox_ips.1.first().map(String::as_str).unwrap_or(""),
                        self.env.exec.clone(),
                    );
                    self.probed.insert(c.name.clone(), latest.id.clone());
                }
                ContainerState::Exited if known => {
                    if never {
                        self.env.probes.remove_container(&self.uid, &c.name);
                        self.probed.remove(&c.name);
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
    fn on_probe(&mut self, u: probes::ProbeUpdate) {
        if u.kind == probes::ProbeKind::Readiness || u.result != probes::ProbeStatus::Failure {
            return;
        }
        if self.probed.get(&u.container_name) != Some(&u.container_id) {
            return;
        }
        let grace = u
            .termination_grace_period_seconds
            .map(|g| Duration::from_secs(g.max(0) as u64).max(MIN_GRACE))
            .unwrap_or_else(|| self.grace());
        tracing::info!(
            container = %u.container_name,
            probe = u.kind.as_str(),
            message = %u.message,
            "Container failed {} probe, will be restarted",
            u.kind.as_str().to_lowercase()
        );
        self.probe_kills
            .push((u.container_id, u.container_name, u.kind, grace));
    }

    async fn kill_for_probes(&mut self, obs: &Observed) -> bool {
        let kills = std::mem::take(&mut self.probe_kills);
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
                self.event(Some(&name), EventType::Normal, "Killing", &message);
                if let Err(e) = self.env.runtime.stop_container(&id, grace).await {
                    tracing::warn!(error = %e, container = %id, "StopContainer after probe failure failed");
                }
                any = true;
            }
        }
        any
    }

    fn publish(&mut self, obs: &Observed, waiting: BTreeMap<String, Waiting>, terminating: bool) {
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
        };
        let st = status::pod_status(&self.pod, &o, self.last_status.as_ref());
        self.note_started(&st);
        if self.last_status.as_ref() != Some(&st) {
            self.env.statuses.set(&self.pod, st.clone());
            self.last_status = Some(st);
        }
    }

    /// Records the pod's start latency (first seen → every container running) once.
    fn note_started(&mut self, st: &PodStatus) {
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

    /// Stops and removes everything of the pod. Returns false if something must be retried.
    pub async fn terminate(&mut self, grace_seconds: i64) -> bool {
        let rt = self.env.runtime.clone();
        let obs = match observe(rt.as_ref(), &self.uid).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the pod's containers to stop them; will retry");
                return false;
            }
        };
        // A pod no source knows (found in the runtime after a restart): its identity and grace
        // period come from what we recorded on its sandbox and containers.
        if self.pod.metadata.name.is_none()
            && let Some(sb) = obs.sandboxes.first()
        {
            self.pod.metadata.name = Some(sb.pod_name.clone());
            self.pod.metadata.namespace = Some(sb.pod_namespace.clone());
        }
        let grace_seconds = if grace_seconds >= 0 {
            grace_seconds
        } else {
            obs.containers
                .iter()
                .filter_map(|(_, c)| c.annotations.get(ANN_POD_GRACE_PERIOD)?.parse::<i64>().ok())
                .max()
                .unwrap_or(30)
        };
        let grace = Duration::from_secs(grace_seconds.max(0) as u64).max(MIN_GRACE);
        // A terminating pod is not probed for liveness; its readiness no longer matters.
        self.env.probes.remove_pod(&self.uid);
        self.probed.clear();
        self.stop_containers(&obs, grace).await;
        let mut clean = true;
        for sb in &obs.sandboxes {
            if let Err(e) = rt.stop_sandbox(&sb.id).await {
                tracing::warn!(error = %e, sandbox = %sb.id, "StopPodSandbox failed");
                clean = false;
            }
        }
        if let Ok(after) = observe(rt.as_ref(), &self.uid).await {
            self.publish(&after, BTreeMap::new(), true);
        }
        for (_, c) in &obs.containers {
            if let Err(e) = rt.remove_container(&c.id).await
                && !matches!(e, RuntimeError::NotFound { .. })
            {
                clean = false;
            }
        }
        for sb in &obs.sandboxes {
            if let Err(e) = rt.remove_sandbox(&sb.id).await
                && !matches!(e, RuntimeError::NotFound { .. })
            {
                tracing::warn!(error = %e, sandbox = %sb.id, "RemovePodSandbox failed");
                clean = false;
            }
        }
        if !clean {
            return false;
        }
        for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            if let Some(path) = self.env.namer.pod_path(qos, &self.uid)
                && let Err(e) = self.env.cgroups.remove(&path)
            {
                tracing::warn!(error = %e, "cannot remove pod cgroup");
            }
        }
        // Only a UID that is one path component names a directory of ours (a runtime's
        // label or a manifest could say `..`); removal walks the disk, off the async workers.
        if crate::pod::is_safe_uid(&self.uid) {
            let pod_dir = spec::pod_dir(&self.env.node, &self.uid);
            let log_dir = spec::pod_log_dir(&self.env.node, &self.pod);
            let binder = self.env.binder.clone();
            // Mounts go first: removing the directory through a bind mount would delete the
            // volume's (a hostPath's) files. While one is left, the directory stays.
            let removed = tokio::task::spawn_blocking(move || {
                binder.unmount_below(&pod_dir)?;
                let _ = std::fs::remove_dir_all(&pod_dir);
                let _ = std::fs::remove_dir_all(&log_dir);
                Ok::<_, std::io::Error>(())
            })
            .await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(error = %e, "cannot unmount the pod's subPath mounts; retrying");
                return false;
            }
        } else {
            tracing::warn!(uid = %self.uid, "not removing pod directories: the UID is not a safe path component");
        }
        self.env.statuses.remove(&self.uid);
        tracing::info!("pod stopped and removed");
        true
    }

    /// Runs until terminated (then reports on `done`) or cancelled (agent shutdown leaves the
    /// pod running, as upstream does).
    pub async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        done: mpsc::UnboundedSender<String>,
        cancel: CancellationToken,
    ) {
        let span = tracing::info_span!(
            "pod",
            namespace = self.pod.metadata.namespace.as_deref().unwrap_or(""),
            name = self.pod.metadata.name.as_deref().unwrap_or(""),
            uid = %self.uid
        );
        async move {
            let mut panics = StepPanics::default();
            let mut terminating: Option<i64> = None;
            let mut next = Instant::now();
            loop {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    msg = rx.recv() => {
                        let Some(msg) = msg else { return };
                        let mut msgs = vec![msg];
                        while let Ok(m) = rx.try_recv() {
                            msgs.push(m);
                        }
                        for m in msgs {
                            match m {
                                Msg::Update(p) => self.pod = *p,
                                Msg::Terminate(g) => terminating = Some(terminating.map_or(g, |t| t.min(g))),
                                Msg::Wake => {}
                                Msg::Probe(u) => self.on_probe(*u),
                            }
                        }
                    }
                    _ = tokio::time::sleep_until(next) => {}
                }
                // A panic in one step (a bug) is contained here: logged, and the step runs
                // again after a back-off. The step is level-triggered (it re-reads the
                // runtime), so whatever it left half done is seen and finished next time.
                if let Some(g) = terminating {
                    match AssertUnwindSafe(self.terminate(g)).catch_unwind().await {
                        Ok(true) => {
                            let _ = done.send(self.uid.clone());
                            return;
                        }
                        Ok(false) => next = Instant::now() + Duration::from_secs(1),
                        Err(p) => next = Instant::now() + panics.record("terminate", p.as_ref()),
                    }
                    continue;
                }
                next = match AssertUnwindSafe(self.sync()).catch_unwind().await {
                    Ok(after) => {
                        panics.reset();
                        Instant::now() + after
                    }
                    Err(p) => Instant::now() + panics.record("sync", p.as_ref()),
                };
            }
        }
        .instrument(span)
        .await
    }
}

/// Panics of a worker's steps in a row, and the wait before the next try: 1 s doubling to
/// 5 min (the crash-loop cap), back to 1 s after a step that completes.
#[derive(Debug, Default)]
struct StepPanics {
    in_a_row: u32,
}

impl StepPanics {
    fn record(&mut self, step: &str, payload: &(dyn std::any::Any + Send)) -> Duration {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let wait = Duration::from_secs(1u64 << self.in_a_row.min(8)).min(Duration::from_secs(300));
        self.in_a_row = self.in_a_row.saturating_add(1);
        tracing::error!(step, panic = %message, retry_in = ?wait, "pod worker step panicked; the pod stays managed and the step runs again");
        wait
    }

    fn reset(&mut self) {
        self.in_a_row = 0;
    }
}

/// A probe manager for tests, without start-up jitter.
#[cfg(test)]
pub(crate) fn test_probes() -> (
    Arc<probes::ProbeManager>,
    mpsc::Receiver<probes::ProbeUpdate>,
) {
    let metrics = probes::ProberMetrics::new(&prometheus::Registry::new()).expect("fresh registry");
    let (m, rx) = probes::ProbeManager::new(
        probes::ManagerConfig {
            jitter: false,
            ..Default::default()
        },
        metrics,
    );
    (Arc::new(m), rx)
}

#[cfg(test)]
mod tests;
