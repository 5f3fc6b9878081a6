//! Container lifecycle hooks, as upstream's `pkg/kubelet/lifecycle/handlers.go`: `postStart`
//! runs right after a container starts (a failure kills it, and it restarts per its restart
//! policy), `preStop` runs before the stop signal, inside the grace period. A handler is an
//! `exec` (through the runtime's ExecSync), an `httpGet` (the probes crate's HTTP client, the
//! host defaulting to the pod IP) or a `sleep`. Also here: stopping one container (preStop,
//! then StopContainer with the grace left) and a whole pod's containers (app containers
//! first, then the sidecars in reverse order).

use super::*;
use ::probes::http::HttpProber;
use ::probes::{Handler, ProbeKind, ProbeResult, ProbeSpec};
use k8s_openapi::api::core::v1::{LifecycleHandler, Probe};

/// Upstream waits for a postStart hook without a time limit; past this, we count it as
/// failed (and say so in the event) rather than hold the pod's worker forever.
pub const POST_START_TIMEOUT: Duration = Duration::from_secs(120);
/// Extra time given to ExecSync past its own timeout before we stop waiting for it.
const EXEC_GRACE: Duration = Duration::from_secs(1);

/// Why a lifecycle hook failed. The texts are upstream's (the container's waiting message
/// after a failed postStart hook shows them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error(
        "Exec lifecycle hook ([{command}]) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {output:?}"
    )]
    Exec {
        command: String,
        container: String,
        pod: String,
        error: String,
        output: String,
    },
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}"
    )]
    Http {
        path: String,
        container: String,
        pod: String,
        error: String,
    },
    #[error(
        "Sleep lifecycle hook ({seconds}) for Container {container:?} in Pod {pod:?} failed - error: container terminated before sleep hook finished"
    )]
    SleepCutShort {
        seconds: i64,
        container: String,
        pod: String,
    },
    /// tcpSocket (accepted by the API for compatibility only) or no handler at all.
    #[error("Cannot run handler: invalid handler: {0}")]
    Invalid(String),
}

/// What a hook runs against.
pub(super) struct HookTarget<'a> {
    pub pod: &'a Pod,
    pub container: &'a K8sContainer,
    pub container_id: &'a str,
    /// The pod's first IP ("" when unknown): httpGet's default host.
    pub pod_ip: &'a str,
}

/// Runs `handler` for at most `timeout`. The error is upstream's event message.
pub(super) async fn run(
    rt: &dyn Runtime,
    t: &HookTarget<'_>,
    handler: &LifecycleHandler,
    timeout: Duration,
) -> Result<(), HookError> {
    let (c, pod) = (&t.container.name, pod_ref(t.pod));
    if let Some(exec) = &handler.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let joined = cmd.join(" ");
        let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let call = rt.exec_sync(t.container_id, &cmd, timeout);
        let (err, output) = match tokio::time::timeout(timeout + EXEC_GRACE, call).await {
            Ok(Ok(r)) if r.exit_code == 0 => return Ok(()),
            Ok(Ok(r)) => (
                format!(
                    "command '{joined}' exited with {}: {}",
                    r.exit_code,
                    lossy(&r.stderr)
                ),
                lossy(&r.stdout) + &lossy(&r.stderr),
            ),
            Ok(Err(e)) => (e.to_string(), String::new()),
            Err(_) => (
                format!(
                    "command '{joined}' timed out after {}",
                    plumbing::duration::format(timeout)
                ),
                String::new(),
            ),
        };
        return Err(HookError::Exec {
            command: joined,
            container: c.clone(),
            pod,
            error: err,
            output,
        });
    }
    if let Some(get) = &handler.http_get {
        let path = get.path.clone().unwrap_or_default();
        return http(t, get, timeout)
            .await
            .map_err(|error| HookError::Http {
                path,
                container: c.clone(),
                pod,
                error: error.to_string(),
            });
    }
    if let Some(sleep) = &handler.sleep {
        let wanted = Duration::from_secs(sleep.seconds.max(0) as u64);
        tokio::time::sleep(wanted.min(timeout)).await;
        if wanted > timeout {
            return Err(HookError::SleepCutShort {
                seconds: sleep.seconds,
                container: c.clone(),
                pod,
            });
        }
        return Ok(());
    }
    // tcpSocket is accepted by the API for compatibility only; upstream cannot run it.
    Err(HookError::Invalid(
        serde_json::to_string(handler).unwrap_or_default(),
    ))
}

/// An httpGet hook. As upstream, only a failed exchange is an error: the status code is not
/// looked at.
async fn http(
    t: &HookTarget<'_>,
    get: &k8s_openapi::api::core::v1::HTTPGetAction,
    timeout: Duration,
) -> Result<(), HttpHookError> {
    let probe = Probe {
        http_get: Some(get.clone()),
        ..Default::default()
    };
    let ports = t.container.ports.clone().unwrap_or_default();
    let spec = ProbeSpec::from_k8s(ProbeKind::Liveness, &probe, &ports)
        .map_err(|e| HttpHookError::Spec(e.to_string().replace("livenessProbe.", "lifecycle.")))?;
    let Handler::HttpGet(h) = spec.handler else {
        return Err(HttpHookError::NotHttp);
    };
    let mut req = h.request(t.pod_ip);
    if req.host.is_empty() {
        return Err(HttpHookError::NoPodIp);
    }
    if !req
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("user-agent"))
    {
        req.headers.push((
            "User-Agent".into(),
            format!("kube-lifecycle/{}", plumbing::version::MAJOR_MINOR),
        ));
    }
    let outcome = HttpProber::new().probe(&req, timeout).await;
    match outcome.result {
        ProbeResult::Success | ProbeResult::Warning => Ok(()),
        // The probe's wording for an answer outside 200..400 (probes/src/http.rs): for a
        // hook, any answer is a success.
        ProbeResult::Failure
            if outcome
                .output
                .starts_with("HTTP probe failed with statuscode") =>
        {
            Ok(())
        }
        _ => Err(HttpHookError::Failed(outcome.output)),
    }
}

/// Why an httpGet hook failed (the `error` of [`HookError::Http`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HttpHookError {
    /// The handler's fields are invalid (the probes crate's message, for `lifecycle.`).
    #[error("{0}")]
    Spec(String),
    #[error("not an httpGet handler")]
    NotHttp,
    #[error("failed to find networking container: the pod has no IP")]
    NoPodIp,
    /// The exchange failed (the HTTP client's message).
    #[error("{0}")]
    Failed(String),
}

impl Worker {
    /// The spec of container `name` (init or app).
    pub(super) fn spec_container(&self, name: &str) -> Option<K8sContainer> {
        let spec = self.pod.spec.as_ref()?;
        spec.init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == name)
            .cloned()
    }

    fn pod_ip(&self) -> &str {
        self.seen
            .sandbox_ips
            .1
            .first()
            .map(String::as_str)
            .unwrap_or("")
    }

    /// Runs the container's postStart hook, if it has one. On failure: a
    /// `FailedPostStartHook` event, the container is killed, and the error is upstream's
    /// message.
    pub(super) async fn post_start(&self, c: &K8sContainer, id: &str) -> Result<(), HookError> {
        let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        let target = HookTarget {
            pod: &self.pod,
            container: c,
            container_id: id,
            pod_ip: self.pod_ip(),
        };
        let Err(error) = run(self.env.runtime.as_ref(), &target, hook, POST_START_TIMEOUT).await
        else {
            return Ok(());
        };
        tracing::warn!(container = %c.name, %error, "postStart hook failed; killing the container");
        // As upstream, the event does not carry the hook's output (it may hold secrets); the
        // container's waiting message does.
        self.event(
            Some(&c.name),
            EventType::Warning,
            "FailedPostStartHook",
            "PostStartHook failed",
        );
        self.kill_container(id, &c.name, self.grace(), Some("FailedPostStartHook"))
            .await;
        Err(error)
    }

    /// Stops one running container: a `Killing` event, its preStop hook (at most `grace`),
    /// then StopContainer with the grace left, never under [`MIN_GRACE`] (upstream).
    pub(super) async fn kill_container(
        &self,
        id: &str,
        name: &str,
        grace: Duration,
        message: Option<&str>,
    ) {
        self.kill_in_turn(id, name, grace, message, &[]).await;
    }

    /// [`Self::kill_container`], sending the stop signal only once every container of `after`
    /// has stopped (or the grace period is over), as upstream's terminationOrdering.
    async fn kill_in_turn(
        &self,
        id: &str,
        name: &str,
        grace: Duration,
        message: Option<&str>,
        after: &[CancellationToken],
    ) {
        let message = message
            .map(str::to_string)
            .unwrap_or_else(|| format!("Stopping container {name}"));
        self.event(Some(name), EventType::Normal, "Killing", &message);
        let mut left = grace;
        let spec = self.spec_container(name);
        let pre_stop = spec
            .as_ref()
            .and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref());
        if let (Some(c), Some(hook), false) = (&spec, pre_stop, grace.is_zero()) {
            let started = Instant::now();
            let target = HookTarget {
                pod: &self.pod,
                container: c,
                container_id: id,
                pod_ip: self.pod_ip(),
            };
            let rt = self.env.runtime.as_ref();
            match tokio::time::timeout(grace, run(rt, &target, hook, grace)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(container = %name, %error, "preStop hook failed");
                    self.event(
                        Some(name),
                        EventType::Warning,
                        "FailedPreStopHook",
                        "PreStopHook failed",
                    );
                }
                Err(_) => {
                    tracing::info!(container = %name, grace_seconds = grace.as_secs(), "preStop hook still running at the end of the grace period");
                }
            }
            // Upstream takes the whole seconds the hook used from the grace period.
            left = grace.saturating_sub(Duration::from_secs(started.elapsed().as_secs()));
        }
        if !after.is_empty() && !left.is_zero() {
            let started = Instant::now();
            let turn = futures::future::join_all(after.iter().map(|t| t.cancelled()));
            if tokio::time::timeout(left, turn).await.is_err() {
                tracing::info!(container = %name, "containers it outlives still running at the end of the grace period");
            }
            left = left.saturating_sub(Duration::from_secs(started.elapsed().as_secs()));
        }
        let left = left.max(MIN_GRACE);
        tracing::info!(container = %name, grace_seconds = left.as_secs(), "Killing container with a grace period");
        if let Err(e) = self.env.runtime.stop_container(id, left).await {
            tracing::warn!(container = %name, error = %e, "StopContainer failed");
        }
    }

    /// Stops every running container of the pod within `grace`, as upstream: every
    /// container's preStop hook starts at once; app (and regular init) containers then get
    /// their stop signal, and each sidecar only once the app containers and the sidecars
    /// after it have stopped, so sidecars stop last, in reverse order.
    pub(super) async fn stop_containers(&self, obs: &Observed, grace: Duration) {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let running: Vec<&ContainerStatus> = obs
            .containers
            .iter()
            .map(|(_, c)| c)
            .filter(|c| c.state == ContainerState::Running)
            .collect();
        // One token per container name, cancelled once it has stopped (at once if it is
        // not running).
        let mut stopped: HashMap<String, CancellationToken> = HashMap::new();
        for c in running.iter() {
            stopped.entry(c.name.clone()).or_default();
        }
        let token = |name: &str| {
            stopped.get(name).cloned().unwrap_or_else(|| {
                let t = CancellationToken::new();
                t.cancel();
                t
            })
        };
        let apps: Vec<CancellationToken> = spec.containers.iter().map(|c| token(&c.name)).collect();
        let mut after: HashMap<String, Vec<CancellationToken>> = HashMap::new();
        let mut later_sidecar: Option<String> = None;
        for ic in spec.init_containers.iter().flatten().rev() {
            if !is_sidecar(ic) {
                continue;
            }
            let mut prereqs = apps.clone();
            if let Some(l) = &later_sidecar {
                prereqs.push(token(l));
            }
            after.insert(ic.name.clone(), prereqs);
            later_sidecar = Some(ic.name.clone());
        }
        let kills = running.iter().map(|c| {
            let prereqs = after.get(&c.name).cloned().unwrap_or_default();
            let done = token(&c.name);
            async move {
                self.kill_in_turn(&c.id, &c.name, grace, None, &prereqs)
                    .await;
                done.cancel();
            }
        });
        futures::future::join_all(kills).await;
    }
}
