//! `/exec`, `/attach`, `/portForward` and `/run` on :10250, as upstream's server.go serves
//! them: the query is checked (`input`/`output`/`error`/`tty` = "1", repeated `command`;
//! `port` for websocket port-forwards), the pod is looked up (404 `pod does not exist`), the
//! runtime is asked for a session on its streaming server (CRI Exec/Attach/PortForward) and
//! the client's HTTP/1.1 upgrade is proxied to the URL it returns, as apimachinery's
//! UpgradeAwareHandler does: the request head goes to the runtime with the URL's path and
//! query and the client's headers, the runtime's answer comes back as is (101 with its
//! negotiated protocol headers, or its error), then bytes are spliced both ways. The kubelet
//! never parses SPDY or websocket frames, so SPDY/3.1 and websocket (`v4.channel.k8s.io`,
//! `portforward.k8s.io`, ...) clients both work with whatever the runtime speaks.
//!
//! A spliced connection is closed once `streamingConnectionIdleTimeout` passes with no byte
//! either way, or when either side ends; `kubelet_streaming_connections{type}` counts the open
//! ones. A websocket client offering `v5.channel.k8s.io` to exec/attach is answered by the
//! kubelet itself and translated to SPDY towards the runtime ([`super::ws_spdy`]), since
//! runtimes' websocket servers stop at v4 (which cannot close stdin). Dialing the runtime and reading its answer are bounded by [`BACKEND_TIMEOUT`]; ending a session (the last frame, each shutdown) by 5 s.
//! `/run` runs ExecSync and returns stdout then stderr.

use super::AppState;
pub use super::upgrade_proxy::{
    BACKEND_TIMEOUT, Backend, BackendHead, SpliceEnd, backend, read_head, request_head, splice,
};
use super::upgrade_proxy::{dial, head_headers, relay_error, relay_upgraded};
use super::ws_spdy;
use crate::runtime::{ContainerState, Runtime, RuntimeError, SandboxState, StreamFlags};
use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// `kubelet_streaming_connections{type}`: spliced exec/attach/port-forward connections open
/// now (not an upstream family; upstream counts them inside `kubelet_http_inflight_requests`).
static OPEN_STREAMS: LazyLock<prometheus::IntGaugeVec> = LazyLock::new(|| {
    prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "kubelet_streaming_connections",
            "[ALPHA] Exec, attach and port-forward connections currently proxied to the container runtime's streaming server.",
        ),
        &["type"],
    )
    .expect("valid gauge")
});

/// `kubelet_streaming_idle_timeouts_total`: spliced connections closed by
/// `streamingConnectionIdleTimeout`.
static IDLE_CLOSED: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::IntCounter::new(
        "kubelet_streaming_idle_timeouts_total",
        "[ALPHA] Exec, attach and port-forward connections closed after streamingConnectionIdleTimeout without traffic.",
    )
    .expect("valid counter")
});

/// The streaming families, for the :10250 registry.
pub fn collectors() -> Vec<Box<dyn prometheus::core::Collector>> {
    vec![
        Box::new(OPEN_STREAMS.clone()),
        Box::new(IDLE_CLOSED.clone()),
    ]
}

/// The streaming handlers' state; part of [`AppState`].
pub struct Streaming {
    runtime: OnceLock<Arc<dyn Runtime>>,
    idle_timeout: Duration,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl Streaming {
    /// `idle_timeout`: `streamingConnectionIdleTimeout`.
    pub fn new(idle_timeout: Duration) -> Streaming {
        Streaming {
            runtime: OnceLock::new(),
            idle_timeout,
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
        }
    }

    /// The container runtime, once the agent has connected to it.
    pub fn set_runtime(&self, rt: Arc<dyn Runtime>) {
        let _ = self.runtime.set(rt);
    }

    /// Closes every spliced connection and waits (at most `grace`) for their tasks.
    pub async fn shutdown(&self, grace: Duration) {
        self.cancel.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
    }

    /// Spliced connections still open.
    pub fn open(&self) -> usize {
        self.tasks.len()
    }
}

/// Which session a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Exec {
        cmd: Vec<String>,
        flags: StreamFlags,
    },
    Attach {
        flags: StreamFlags,
    },
    PortForward {
        ports: Vec<i32>,
    },
}

impl Kind {
    fn flags(&self) -> Option<StreamFlags> {
        match self {
            Kind::Exec { flags, .. } | Kind::Attach { flags } => Some(*flags),
            Kind::PortForward { .. } => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Kind::Exec { .. } => "exec",
            Kind::Attach { .. } => "attach",
            Kind::PortForward { .. } => "portforward",
        }
    }
}

/// An answer other than a proxied stream: the same plain-text refusal the logs endpoints give.
pub use super::logs::Refusal;

fn refuse(status: StatusCode, body: impl Into<String>) -> Refusal {
    Refusal::new(status, body)
}

fn first<'a>(query: &'a [(String, String)], key: &str) -> &'a str {
    query
        .iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, v)| v.as_str())
}

/// Upstream's remotecommand NewOptions: each stream is on only for "1"; tty drops stderr; no
/// stream at all is a 400.
pub fn stream_flags(query: &[(String, String)]) -> Result<StreamFlags, Refusal> {
    let tty = first(query, "tty") == "1";
    let mut f = StreamFlags {
        stdin: first(query, "input") == "1",
        stdout: first(query, "output") == "1",
        stderr: first(query, "error") == "1",
        tty,
    };
    if tty && f.stderr {
        tracing::debug!("exec/attach with tty and stderr: stderr is not streamed");
        f.stderr = false;
    }
    if !f.stdin && !f.stdout && !f.stderr {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    Ok(f)
}

/// True for a websocket upgrade request (`Connection: upgrade` + `Upgrade: websocket`).
pub fn is_websocket(headers: &HeaderMap) -> bool {
    is_upgrade(headers)
        && headers
            .get_all(header::UPGRADE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.trim().eq_ignore_ascii_case("websocket"))
}

/// True when `Connection` names `upgrade` and an `Upgrade` protocol is given.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let conn = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    conn && headers
        .get(header::UPGRADE)
        .is_some_and(|v| !v.as_bytes().is_empty())
}

/// Upstream's port-forward V4 options: websocket clients name their ports in `port` (repeated
/// or comma-separated); SPDY clients name them per stream, so none here.
pub fn forward_ports(query: &[(String, String)], websocket: bool) -> Result<Vec<i32>, Refusal> {
    if !websocket {
        return Ok(vec![]);
    }
    let bad = |m: String| refuse(StatusCode::BAD_REQUEST, m);
    let values: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "port")
        .map(|(_, v)| v.as_str())
        .collect();
    if values.is_empty() {
        return Err(bad("query parameter \"port\" is required".into()));
    }
    let mut ports = Vec::new();
    for v in values {
        if v.is_empty() {
            return Err(bad("query parameter \"port\" cannot be empty".into()));
        }
        for p in v.split(',') {
            let n: u16 = p
                .parse()
                .map_err(|e| bad(format!("unable to parse {v:?} as a port: {e}")))?;
            if n < 1 {
                return Err(bad(format!("port {v:?} must be > 0")));
            }
            ports.push(i32::from(n));
        }
    }
    Ok(ports)
}

/// The pod the path names, from the pods the kubelet manages (404 as upstream).
pub fn find_pod<'a>(pods: &'a [Pod], ns: &str, name: &str) -> Result<&'a Pod, Refusal> {
    pods.iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == ns
                && p.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| refuse(StatusCode::NOT_FOUND, "pod does not exist"))
}

/// The named pod's UID. A `{uid}` segment must be that UID: another is a 404 `pod not found`
/// (upstream's port-forward check, applied to exec, attach and run too), so the containers are
/// always looked up in the pod the path names, never in the pod a UID points at.
fn pod_uid(pod: &Pod, p: &Params) -> Result<String, Refusal> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    match param(p, "uid") {
        "" => Ok(uid),
        given if given == uid => Ok(uid),
        _ => Err(refuse(StatusCode::NOT_FOUND, "pod not found")),
    }
}

fn runtime_refusal(e: RuntimeError) -> Refusal {
    // Upstream's streaming.WriteError: gRPC NotFound → 404, everything else 500.
    let status = match e {
        RuntimeError::NotFound { .. } => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(status, e.to_string())
}

/// The running container `container` of the pod with `uid`, as upstream's findContainer
/// (running containers only; 500 `container not found` otherwise).
async fn running_container(
    rt: &dyn Runtime,
    uid: &str,
    container: &str,
) -> Result<String, Refusal> {
    let sandboxes: Vec<String> = rt
        .list_pod_sandboxes(uid)
        .await
        .map_err(runtime_refusal)?
        .into_iter()
        .map(|s| s.id)
        .collect();
    rt.list_pod_containers(uid)
        .await
        .map_err(runtime_refusal)?
        .into_iter()
        .filter(|c| {
            c.name == container
                && c.state == ContainerState::Running
                && sandboxes.contains(&c.sandbox_id)
        })
        .max_by_key(|c| c.created_at)
        .map(|c| c.id)
        .ok_or_else(|| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("container not found ({container:?})"),
            )
        })
}

/// The pod's ready sandbox (upstream: `pod not found ("<name>_<ns>")`, 500).
async fn ready_sandbox(rt: &dyn Runtime, uid: &str, full_name: &str) -> Result<String, Refusal> {
    rt.list_pod_sandboxes(uid)
        .await
        .map_err(runtime_refusal)?
        .into_iter()
        .filter(|s| s.state == SandboxState::Ready)
        .max_by_key(|s| s.created_at)
        .map(|s| s.id)
        .ok_or_else(|| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("pod not found ({full_name:?})"),
            )
        })
}

fn runtime(s: &Streaming) -> Result<&Arc<dyn Runtime>, Refusal> {
    s.runtime.get().ok_or_else(|| {
        refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the container runtime is not connected yet",
        )
    })
}

fn query_of(req: &Request) -> Vec<(String, String)> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(req.uri())
        .map(|q| q.0)
        .unwrap_or_default()
}

/// Path parameters of the streaming routes (`ns`, `pod`, optional `uid`, `container`).
type Params = HashMap<String, String>;

fn param<'a>(p: &'a Params, k: &str) -> &'a str {
    p.get(k).map_or("", String::as_str)
}

/// GET/POST `/exec/{ns}/{pod}[/{uid}]/{container}`.
pub async fn exec(
    State(s): State<AppState>,
    UrlPath(p): UrlPath<Params>,
    req: Request,
) -> Response {
    let q = query_of(&req);
    let kind = stream_flags(&q).map(|flags| Kind::Exec {
        cmd: q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect(),
        flags,
    });
    serve(&s, &p, kind, req).await
}

/// GET/POST `/attach/{ns}/{pod}[/{uid}]/{container}`.
pub async fn attach(
    State(s): State<AppState>,
    UrlPath(p): UrlPath<Params>,
    req: Request,
) -> Response {
    let kind = stream_flags(&query_of(&req)).map(|flags| Kind::Attach { flags });
    serve(&s, &p, kind, req).await
}

/// GET/POST `/portForward/{ns}/{pod}[/{uid}]`.
pub async fn port_forward(
    State(s): State<AppState>,
    UrlPath(p): UrlPath<Params>,
    req: Request,
) -> Response {
    let ws = is_websocket(req.headers());
    let kind = forward_ports(&query_of(&req), ws).map(|ports| Kind::PortForward { ports });
    serve(&s, &p, kind, req).await
}

async fn serve(s: &AppState, p: &Params, kind: Result<Kind, Refusal>, req: Request) -> Response {
    let upgrade = is_upgrade(req.headers());
    let v5 = is_websocket(req.headers()) && ws_spdy::offers_v5(req.headers());
    match session(s, p, kind, upgrade).await {
        Ok((kind, url)) if v5 && kind.flags().is_some() => {
            let flags = kind.flags().unwrap_or_default();
            translate_v5(&s.streaming, kind.label(), flags, &url, req).await
        }
        Ok((kind, url)) => proxy(&s.streaming, kind.label(), &url, req).await,
        Err(r) => r.into_response(),
    }
}

/// Checks the request and asks the runtime for a session; the URL to proxy to.
async fn session(
    s: &AppState,
    p: &Params,
    kind: Result<Kind, Refusal>,
    upgrade: bool,
) -> Result<(Kind, String), Refusal> {
    let kind = kind?;
    let pods = s.statuses.pods();
    let (ns, name) = (param(p, "ns"), param(p, "pod"));
    let pod = find_pod(&pods, ns, name)?;
    let uid = pod_uid(pod, p)?;
    let rt = runtime(&s.streaming)?;
    // Upstream calls the runtime first, then refuses a plain request in the proxy; checking
    // first gives the same answer without leaving an unused session on the runtime.
    let url = match &kind {
        Kind::PortForward { ports } => {
            let sandbox = ready_sandbox(rt.as_ref(), &uid, &format!("{name}_{ns}")).await?;
            require_upgrade(upgrade)?;
            rt.port_forward(&sandbox, ports).await
        }
        Kind::Exec { cmd, flags } => {
            let id = running_container(rt.as_ref(), &uid, param(p, "container")).await?;
            require_upgrade(upgrade)?;
            rt.exec(&id, cmd, *flags).await
        }
        Kind::Attach { flags } => {
            let id = running_container(rt.as_ref(), &uid, param(p, "container")).await?;
            require_upgrade(upgrade)?;
            rt.attach(&id, *flags).await
        }
    }
    .map_err(runtime_refusal)?;
    Ok((kind, url))
}

fn require_upgrade(upgrade: bool) -> Result<(), Refusal> {
    if upgrade {
        Ok(())
    } else {
        // UpgradeAwareHandler's BadRequest, written by the kubelet's responder as a 500.
        Err(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Upgrade request required\n",
        ))
    }
}

/// POST `/run/{ns}/{pod}[/{uid}]/{container}?cmd=...`: ExecSync, stdout then stderr.
pub async fn run(State(s): State<AppState>, UrlPath(p): UrlPath<Params>, req: Request) -> Response {
    match run_in_container(&s, &p, &query_of(&req)).await {
        Ok(out) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            out,
        )
            .into_response(),
        Err(r) => r.into_response(),
    }
}

async fn run_in_container(
    s: &AppState,
    p: &Params,
    q: &[(String, String)],
) -> Result<Vec<u8>, Refusal> {
    let pods = s.statuses.pods();
    let pod = find_pod(&pods, param(p, "ns"), param(p, "pod"))?;
    let uid = pod_uid(pod, p)?;
    // For legacy reasons /run splits `cmd` on spaces.
    let cmd: Vec<String> = first(q, "cmd").split(' ').map(String::from).collect();
    let rt = runtime(&s.streaming)?;
    let id = running_container(rt.as_ref(), &uid, param(p, "container")).await?;
    // Timeout 0: no limit on the command itself; the CRI call still has the runtime timeout.
    let r = rt
        .exec_sync(&id, &cmd, Duration::ZERO)
        .await
        .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if r.exit_code != 0 {
        return Err(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command '{}' exited with {}: {}",
                cmd.join(" "),
                r.exit_code,
                String::from_utf8_lossy(&r.stderr)
            ),
        ));
    }
    let mut out = r.stdout;
    out.extend_from_slice(&r.stderr);
    Ok(out)
}

/// Proxies the upgrade to the runtime's streaming server at `url`.
async fn proxy(st: &Arc<Streaming>, label: &'static str, url: &str, mut req: Request) -> Response {
    let b = match backend(url) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let head = request_head(req.method(), req.headers(), &b);
    let (conn, head) = match dial(url, &b, &head).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if head.status != StatusCode::SWITCHING_PROTOCOLS {
        return relay_error(conn, head).await;
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let st2 = st.clone();
    st.tasks.spawn(async move {
        let client = match tokio::time::timeout(BACKEND_TIMEOUT, on_upgrade).await {
            Ok(Ok(u)) => hyper_util::rt::TokioIo::new(u),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "client upgrade failed");
                return;
            }
            Err(_) => return,
        };
        let gauge = OPEN_STREAMS.with_label_values(&[label]);
        gauge.inc();
        let end = relay_upgraded(client, conn, head.rest, st2.idle_timeout, &st2.cancel).await;
        if end == SpliceEnd::Idle {
            IDLE_CLOSED.inc();
            tracing::info!(
                r#type = label,
                timeout = ?st2.idle_timeout,
                "streaming connection closed after streamingConnectionIdleTimeout without traffic"
            );
        }
        gauge.dec();
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *resp.headers_mut() = head_headers(&head.headers);
    resp
}

/// A websocket `v5.channel.k8s.io` exec/attach: the kubelet answers the client's websocket
/// itself and speaks SPDY to the runtime ([`ws_spdy`]), as upstream's stream translator.
async fn translate_v5(
    st: &Arc<Streaming>,
    label: &'static str,
    flags: StreamFlags,
    url: &str,
    mut req: Request,
) -> Response {
    let Some(key) = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|k| k.to_str().ok())
        .map(String::from)
    else {
        return refuse(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key").into_response();
    };
    let b = match backend(url) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let (conn, head) = match dial(url, &b, &ws_spdy::spdy_request(&b.target, &b.authority)).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if head.status != StatusCode::SWITCHING_PROTOCOLS {
        return relay_error(conn, head).await;
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let st2 = st.clone();
    st.tasks.spawn(async move {
        let client = match tokio::time::timeout(BACKEND_TIMEOUT, on_upgrade).await {
            Ok(Ok(u)) => hyper_util::rt::TokioIo::new(u),
            _ => return,
        };
        let gauge = OPEN_STREAMS.with_label_values(&[label]);
        gauge.inc();
        let idled = ws_spdy::translate(
            client,
            conn,
            head.rest,
            flags,
            st2.idle_timeout,
            &st2.cancel,
        )
        .await;
        if idled {
            IDLE_CLOSED.inc();
        }
        gauge.dec();
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&ws_spdy::accept_key(&key)) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(ws_spdy::V5),
    );
    resp
}

#[cfg(test)]
mod tests;
