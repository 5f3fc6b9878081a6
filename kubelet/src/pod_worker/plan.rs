//! The pure part of a pass: what to do for a pod given what the runtime has ([`plan`]), and
//! the per-container restart back-off (CrashLoopBackOff).

use super::*;
use k8s_openapi::api::core::v1::PodSpec;

/// Per-container-name restart back-off.
#[derive(Debug, Clone)]
pub struct Backoff {
    entries: HashMap<String, BackoffEntry>,
    /// The cap (`crashLoopBackOff.maxContainerRestartPeriod`).
    max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(BACKOFF_MAX)
    }
}

#[derive(Debug, Clone)]
pub(super) struct BackoffEntry {
    exit_id: String,
    restart_at: Instant,
    delay: Duration,
    /// None until the first restart (which is immediate), then 10 s doubling to 5 min.
    next: Option<plumbing::Backoff>,
}

impl Backoff {
    /// A back-off capped at `max`: the first delay is 10 s, or `max` when that is lower (as
    /// upstream's newCrashLoopBackOff), and a container that ran for twice the cap starts
    /// afresh (upstream's back-off entries expire after twice their maximum).
    pub fn new(max: Duration) -> Self {
        Backoff {
            entries: HashMap::new(),
            max,
        }
    }

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
                next: None,
            });
        if entry.exit_id != exit_id {
            // A new exit: schedule the restart after the current back-off, then double it.
            if ran_for >= self.max * 2 {
                entry.next = None;
            }
            entry.exit_id = exit_id.to_string();
            entry.delay = match &mut entry.next {
                Some(b) => b.fail_at(now),
                None => {
                    let initial = BACKOFF_INITIAL.min(self.max);
                    entry.next = Some(plumbing::Backoff::new(initial, self.max));
                    Duration::ZERO
                }
            };
            entry.restart_at = now + entry.delay;
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
    /// Running container instances whose startup probe has not succeeded yet (the worker
    /// fills it from the prober): a sidecar among them holds back the next init container.
    pub not_started: HashSet<String>,
    /// Running container instances a resize restarts (`resizePolicy: RestartContainer`).
    pub resize_restart: HashSet<String>,
}

impl Observed {
    pub(super) fn newest<'a>(
        &'a self,
        name: &str,
        sandbox: Option<&str>,
    ) -> Option<&'a ContainerStatus> {
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

/// One thing a pass does in the runtime. [`plan`] lists them in the order [`Worker::act`]
/// carries them out: stops first, then the sandbox, then the starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop every running container of the pod (app containers before sidecars) and its
    /// newest sandbox.
    KillPod,
    /// Stop a running container whose spec changed; a replacement start follows.
    KillContainer { id: String, name: String },
    /// Remove an instance that was created but never started (its logs first).
    RemoveContainer { id: String },
    /// Create the pod's sandbox (pod cgroup, log directory, RunPodSandbox) with this attempt
    /// number; volumes are set up meanwhile.
    CreateSandbox { attempt: u32 },
    /// Pull, create and start an init container in the ready sandbox; a failure stops the
    /// starts after it.
    StartInitContainer { name: String, restart_count: u32 },
    /// Pull, create and start an app container in the ready sandbox.
    StartContainer { name: String, restart_count: u32 },
    /// Pull, create and start an ephemeral container in the ready sandbox (once: it is never
    /// restarted).
    StartEphemeralContainer { name: String },
}

impl Action {
    /// The container this action starts, if it starts one.
    pub fn start(&self) -> Option<Start> {
        match self {
            Action::StartInitContainer {
                name,
                restart_count,
            } => Some(Start {
                name: name.clone(),
                init: true,
                restart_count: *restart_count,
            }),
            Action::StartContainer {
                name,
                restart_count,
            } => Some(Start {
                name: name.clone(),
                init: false,
                restart_count: *restart_count,
            }),
            Action::StartEphemeralContainer { name } => Some(Start {
                name: name.clone(),
                init: false,
                restart_count: 0,
            }),
            _ => None,
        }
    }

    fn from_start(s: Start) -> Action {
        let Start {
            name,
            init,
            restart_count,
        } = s;
        if init {
            Action::StartInitContainer {
                name,
                restart_count,
            }
        } else {
            Action::StartContainer {
                name,
                restart_count,
            }
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::KillPod => write!(f, "KillPod"),
            Action::KillContainer { id, name } => write!(f, "KillContainer {name} ({id})"),
            Action::RemoveContainer { id } => write!(f, "RemoveContainer {id}"),
            Action::CreateSandbox { attempt } => write!(f, "CreateSandbox attempt={attempt}"),
            Action::StartInitContainer {
                name,
                restart_count,
            } => write!(f, "StartInitContainer {name} restartCount={restart_count}"),
            Action::StartContainer {
                name,
                restart_count,
            } => write!(f, "StartContainer {name} restartCount={restart_count}"),
            Action::StartEphemeralContainer { name } => write!(f, "StartEphemeralContainer {name}"),
        }
    }
}

/// What one pass decides: the actions, in order, and what the containers not started now
/// wait for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Waiting reasons for containers that are not started now.
    pub waiting: BTreeMap<String, Waiting>,
    /// Come back this soon (a back-off ends).
    pub wake_after: Option<Duration>,
}

impl Plan {
    /// The containers this plan starts, in order.
    pub fn starts(&self) -> Vec<Start> {
        self.actions.iter().filter_map(Action::start).collect()
    }
}

/// The decision while [`plan`] makes it; [`Draft::finish`] orders it into actions.
#[derive(Debug, Default)]
pub(super) struct Draft {
    kill_pod: bool,
    create_sandbox: Option<u32>,
    /// Containers to stop (ID, name) before starting replacements.
    kill: Vec<(String, String)>,
    /// Instances to remove (created but never started).
    remove: Vec<String>,
    start: Vec<Start>,
    /// Ephemeral containers to start (before the init and app containers, as upstream).
    ephemeral: Vec<String>,
    waiting: BTreeMap<String, Waiting>,
    wake_after: Option<Duration>,
}

impl Draft {
    fn finish(self) -> Plan {
        let mut actions = Vec::new();
        if self.kill_pod {
            actions.push(Action::KillPod);
        }
        actions.extend(
            self.kill
                .into_iter()
                .map(|(id, name)| Action::KillContainer { id, name }),
        );
        actions.extend(
            self.remove
                .into_iter()
                .map(|id| Action::RemoveContainer { id }),
        );
        if let Some(attempt) = self.create_sandbox {
            actions.push(Action::CreateSandbox { attempt });
        }
        // A pod being stopped starts no ephemeral container.
        if !self.kill_pod {
            actions.extend(
                self.ephemeral
                    .into_iter()
                    .map(|name| Action::StartEphemeralContainer { name }),
            );
        }
        actions.extend(self.start.into_iter().map(Action::from_start));
        Plan {
            actions,
            waiting: self.waiting,
            wake_after: self.wake_after,
        }
    }
}

/// The plan of a pod stopped for good: stop whatever still runs, start nothing.
pub fn plan_stopped(obs: &Observed) -> Plan {
    let runs = obs
        .sandboxes
        .first()
        .is_some_and(|s| s.state == SandboxState::Ready)
        || obs
            .containers
            .iter()
            .any(|(_, c)| c.state == ContainerState::Running);
    Plan {
        actions: if runs {
            vec![Action::KillPod]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

pub(super) fn restart_count_of(c: &ContainerStatus) -> u32 {
    c.annotations
        .get(ANN_RESTART_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(super) fn ran_for(c: &ContainerStatus) -> Duration {
    Duration::from_nanos((c.finished_at - c.started_at).max(0) as u64)
}

/// A restartable init container (`restartPolicy: Always`): a sidecar.
pub fn is_sidecar(c: &K8sContainer) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// `name_namespace(uid)`, as upstream prints pods in back-off messages.
pub(super) fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

/// Decides what to do for `pod` given what the runtime has. Pure apart from the back-off
/// table.
pub fn plan(pod: &Pod, obs: &Observed, backoff: &mut Backoff, now: Instant) -> Plan {
    draft(pod, obs, backoff, now).finish()
}

fn draft(pod: &Pod, obs: &Observed, backoff: &mut Backoff, now: Instant) -> Draft {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut p = Draft::default();
    // Dead instances beyond the newest are container GC's (`maxPerPodContainer`), as upstream.
    let sandbox = obs.sandboxes.first();
    let Some(sandbox) = sandbox.filter(|s| s.state == SandboxState::Ready) else {
        draft_new_sandbox(&mut p, &spec, obs, sandbox);
        return p;
    };
    let cx = Pass {
        pod,
        spec: &spec,
        obs,
        sb: Some(sandbox.id.as_str()),
        now,
    };
    // Ephemeral containers start once the sandbox is ready, even before the pod has
    // initialized, and run once: an instance of one in any sandbox (running, exited or never
    // started) means it is not started again (upstream).
    for e in spec.ephemeral_containers.iter().flatten() {
        if obs.newest(&e.name, None).is_none() {
            p.ephemeral.push(e.name.clone());
        }
    }
    if draft_inits(&mut p, &cx, backoff) {
        draft_apps(&mut p, &cx, backoff);
    }
    p
}

/// What a pass looks at once the pod has a ready sandbox.
struct Pass<'a> {
    pod: &'a Pod,
    spec: &'a PodSpec,
    obs: &'a Observed,
    /// The ready sandbox's ID.
    sb: Option<&'a str>,
    now: Instant,
}

impl Pass<'_> {
    fn policy(&self) -> &str {
        self.spec.restart_policy.as_deref().unwrap_or("Always")
    }
}

/// The restart count of `name`'s next instance (one more than its newest, in any sandbox).
fn next_count(obs: &Observed, name: &str) -> u32 {
    obs.newest(name, None)
        .map(|c| restart_count_of(c) + 1)
        .unwrap_or(0)
}

fn start(name: &str, init: bool, restart_count: u32) -> Start {
    Start {
        name: name.to_string(),
        init,
        restart_count,
    }
}

/// No usable sandbox (`sandbox`: the newest, not ready): a new one, unless the pod has run
/// and must not restart.
fn draft_new_sandbox(p: &mut Draft, spec: &PodSpec, obs: &Observed, sandbox: Option<&Sandbox>) {
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let attempt = sandbox.map(|s| s.attempt + 1).unwrap_or(0);
    if sandbox.is_some() {
        p.kill_pod = obs
            .containers
            .iter()
            .any(|(_, c)| c.state == ContainerState::Running);
    }
    // A pod none of whose containers may restart (pod policy Never, no container policy
    // or rule that restarts) gets no new sandbox once it has run.
    let restartable = policy != "Never"
        || spec
            .containers
            .iter()
            .any(|c| pod::container_restartable(c, spec));
    if !restartable && attempt != 0 && !obs.containers.is_empty() {
        return;
    }
    // Upstream: a new sandbox restarts from the first init container, unless the pod
    // has initialized before and none of its app containers is to run again. A container
    // that exited and is not to restart (its restart policy and rules, or the pod's)
    // stays done.
    let apps: Vec<Start> = spec
        .containers
        .iter()
        .filter(|c| {
            !obs.newest(&c.name, None).is_some_and(|s| {
                s.state == ContainerState::Exited
                    && !pod::container_should_restart(c, spec, s.exit_code)
            })
        })
        .map(|c| start(&c.name, false, next_count(obs, &c.name)))
        .collect();
    let initialized = spec
        .containers
        .iter()
        .any(|c| obs.newest(&c.name, None).is_some());
    let first_init = spec.init_containers.iter().flatten().next();
    let to_start: Vec<Start> = if initialized && apps.is_empty() {
        Vec::new()
    } else if let Some(first) = first_init {
        vec![start(&first.name, true, next_count(obs, &first.name))]
    } else {
        apps
    };
    if to_start.is_empty() {
        return;
    }
    p.kill_pod = sandbox.is_some();
    p.create_sandbox = Some(attempt);
    p.start = to_start;
}

/// Init containers run one at a time, in order; each must succeed before the next. A
/// sidecar (restartable init container) only has to be started (running, and past its
/// startup probe if it has one); it keeps running beside the app containers and is
/// restarted whenever it exits. Once a later container has been created, the earlier
/// regular init containers are done for good. True: the pod is initialized, its app
/// containers are next.
fn draft_inits(p: &mut Draft, cx: &Pass<'_>, backoff: &mut Backoff) -> bool {
    let (obs, sb) = (cx.obs, cx.sb);
    let inits: Vec<&K8sContainer> = cx.spec.init_containers.iter().flatten().collect();
    let initialized = cx
        .spec
        .containers
        .iter()
        .any(|c| obs.newest(&c.name, sb).is_some());
    for (i, c) in inits.iter().enumerate() {
        let passed = initialized
            || inits[i + 1..]
                .iter()
                .any(|n| obs.newest(&n.name, sb).is_some());
        let status = obs.newest(&c.name, sb);
        if is_sidecar(c) {
            if draft_sidecar(p, cx, backoff, c, status) && !passed {
                return false;
            }
            continue;
        }
        if passed {
            continue;
        }
        match status {
            None => {
                p.start.push(start(&c.name, true, next_count(obs, &c.name)));
                return false;
            }
            Some(s) if s.state == ContainerState::Running => return false,
            Some(s) if s.state == ContainerState::Exited && s.exit_code == 0 => continue,
            Some(s) if s.state == ContainerState::Exited => {
                if cx.policy() == "Never" {
                    p.kill_pod = true;
                    p.start.clear();
                    return false;
                }
                restart_or_wait(p, backoff, cx.pod, c, true, s, cx.now);
                return false;
            }
            Some(s) => {
                p.remove.push(s.id.clone());
                p.start.push(start(&c.name, true, restart_count_of(s)));
                return false;
            }
        }
    }
    true
}

/// A sidecar's step; true: it blocks the init containers after it (not started yet).
fn draft_sidecar(
    p: &mut Draft,
    cx: &Pass<'_>,
    backoff: &mut Backoff,
    c: &K8sContainer,
    status: Option<&ContainerStatus>,
) -> bool {
    match status {
        None => {
            p.start
                .push(start(&c.name, true, next_count(cx.obs, &c.name)));
            true
        }
        Some(s) if s.state == ContainerState::Running => {
            if must_replace(cx.obs, c, s) {
                p.kill.push((s.id.clone(), c.name.clone()));
                p.start.push(start(&c.name, true, restart_count_of(s) + 1));
                true
            } else {
                cx.obs.not_started.contains(&s.id)
            }
        }
        Some(s) if s.state == ContainerState::Exited => {
            restart_or_wait(p, backoff, cx.pod, c, true, s, cx.now);
            true
        }
        Some(s) => {
            p.remove.push(s.id.clone());
            p.start.push(start(&c.name, true, restart_count_of(s)));
            true
        }
    }
}

/// A running instance whose spec changed, or that a resize needs restarted.
fn must_replace(obs: &Observed, c: &K8sContainer, s: &ContainerStatus) -> bool {
    s.annotations
        .get(ANN_CONTAINER_HASH)
        .is_some_and(|h| *h != pod::container_hash(c))
        || obs.resize_restart.contains(&s.id)
}

/// The app containers of an initialized pod: start the missing, replace the changed,
/// restart the exited as their policy says; once every one is done for good, the pod stops.
fn draft_apps(p: &mut Draft, cx: &Pass<'_>, backoff: &mut Backoff) {
    let (spec, obs) = (cx.spec, cx.obs);
    let mut running = 0;
    for c in &spec.containers {
        match obs.newest(&c.name, cx.sb) {
            None => p
                .start
                .push(start(&c.name, false, next_count(obs, &c.name))),
            Some(s) if s.state == ContainerState::Running => {
                if must_replace(obs, c, s) {
                    // The spec changed, or a resize needs a restart: replace the container.
                    p.kill.push((s.id.clone(), c.name.clone()));
                    p.start.push(start(&c.name, false, restart_count_of(s) + 1));
                } else {
                    running += 1;
                }
            }
            Some(s) if s.state == ContainerState::Exited => {
                if pod::container_should_restart(c, spec, s.exit_code) {
                    restart_or_wait(p, backoff, cx.pod, c, false, s, cx.now);
                }
            }
            Some(s) => {
                // Created but never started (a failed start): clear it and try again.
                p.remove.push(s.id.clone());
                p.start.push(start(&c.name, false, restart_count_of(s)));
            }
        }
    }
    let app = |name: &str| spec.containers.iter().any(|c| c.name == name);
    if running == 0 && !p.start.iter().any(|s| !s.init) && !p.waiting.keys().any(|n| app(n)) {
        // Every app container is done for good: the sidecars and the sandbox go too, and
        // no sidecar is restarted to keep the pod alive (upstream).
        p.kill_pod = true;
        p.start.clear();
        p.kill.clear();
        p.waiting.retain(|n, _| app(n));
    }
}

fn restart_or_wait(
    p: &mut Draft,
    backoff: &mut Backoff,
    pod: &Pod,
    c: &K8sContainer,
    init: bool,
    s: &ContainerStatus,
    now: Instant,
) {
    match backoff.check(&c.name, &s.id, ran_for(s), now) {
        Ok(()) => p.start.push(Start {
            name: c.name.clone(),
            init,
            restart_count: restart_count_of(s) + 1,
        }),
        Err((remaining, delay)) => {
            p.waiting.insert(
                c.name.clone(),
                Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: format!(
                        "back-off {} restarting failed container={} pod={}",
                        plumbing::duration::format(delay),
                        c.name,
                        pod_ref(pod)
                    ),
                },
            );
            p.wake_after = Some(p.wake_after.map_or(remaining, |w| w.min(remaining)));
        }
    }
}

#[cfg(test)]
mod tests;
