//! HTTPS front end: TLS with optional client certificates, authentication,
//! authorization, routing of the Kubernetes REST paths, and watch streaming.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::authz::{Attrs, attrs};
use super::pki::{Authority, identity_of};
use super::resources::{self, RESOURCES, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{
    API_AUDIENCE, DeleteOpts, RequestRecord, Store, Subresource, UserInfo, WatchMsg,
};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// State shared by every connection.
#[derive(Debug)]
pub struct Shared {
    pub store: Mutex<Store>,
    pub ca: Arc<Authority>,
    pub tokens: Mutex<HashMap<String, UserInfo>>,
    pub bookmark_interval: Duration,
    pub default_watch_timeout: Duration,
    pub git_version: String,
    /// SubjectAccessReview grants.
    pub grants: super::reviews::Grants,
    /// RBAC bindings added at run time (beyond the bootstrap and kubeadm tables).
    pub rbac: Mutex<Vec<super::authz::rbac::RuntimeBinding>>,
}

impl Shared {
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

const MAX_REQUESTS_LOGGED: usize = 20_000;

fn full(code: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error(e: &ApiError) -> Response<Body> {
    let mut r = full(e.code, &e.to_status());
    if e.code == 429 || e.code == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Percent-decoding for query strings (`+` is a space).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(kv), String::new()),
        })
        .collect()
}

fn truthy(v: Option<&String>) -> bool {
    v.is_some_and(|v| v == "1" || v == "true")
}

/// Who is calling: a bearer token (bootstrap or static), else the TLS client certificate.
fn authenticate(
    shared: &Shared,
    peer: &Option<(String, Vec<String>)>,
    req: &Request<Incoming>,
) -> Result<UserInfo, ApiError> {
    if let Some(h) = req.headers().get(header::AUTHORIZATION) {
        let h = h.to_str().unwrap_or("");
        let token = h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
            .ok_or_else(ApiError::unauthorized)?
            .trim();
        let known = shared
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned();
        return known
            .or_else(|| shared.store().authenticate_token(token))
            .ok_or_else(ApiError::unauthorized);
    }
    match peer {
        Some((cn, orgs)) if !cn.is_empty() => {
            let mut groups = orgs.clone();
            groups.push("system:authenticated".into());
            Ok(UserInfo {
                name: cn.clone(),
                groups,
            })
        }
        _ => Err(ApiError::unauthorized()),
    }
}

/// Node, then RBAC ([`super::authz`]): `Ok` or the 403 upstream sends.
fn authorize(
    shared: &Shared,
    user: &UserInfo,
    res: &ResourceDef,
    a: &Attrs<'_>,
) -> Result<(), ApiError> {
    let runtime = shared
        .rbac
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    super::authz::check(&*shared.store(), user, res, a, &runtime)
}

/// A parsed resource URL.
#[derive(Debug)]
struct Target {
    res: &'static ResourceDef,
    namespace: Option<String>,
    name: Option<String>,
    sub: String,
}

enum Route {
    Version,
    Root(Value),
    Healthz,
    /// Service account issuer discovery: `/.well-known/openid-configuration`.
    OidcConfig,
    /// The token signing keys: `/openid/v1/jwks`.
    Jwks,
    Resource(Target),
    /// `authentication.k8s.io/v1 tokenreviews`.
    TokenReview,
    /// `authorization.k8s.io/v1 subjectaccessreviews`.
    AccessReview,
    NotFound,
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut out = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        out.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": r.short,
        }));
        if r.status {
            out.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.group.is_empty() && r.plural == "pods" {
            out.push(json!({"name": "pods/ephemeralcontainers", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get", "patch", "update"]}));
        }
        if r.group.is_empty() && r.plural == "nodes" {
            out.push(json!({"name": "nodes/proxy", "singularName": "", "namespaced": false, "kind": "NodeProxyOptions", "verbs": ["create", "delete", "get", "patch", "update"]}));
        }
        if r.approval {
            out.push(json!({"name": format!("{}/approval", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.group.is_empty() && r.plural == "serviceaccounts" {
            out.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out })
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Healthz,
        [".well-known", "openid-configuration"] => return Route::OidcConfig,
        ["openid", "v1", "jwks"] => return Route::Jwks,
        ["api"] => {
            return Route::Root(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
            }));
        }
        ["apis"] => {
            let groups: Vec<Value> = resources::groups()
                .into_iter()
                .map(|g| {
                    json!({
                        "name": g,
                        "versions": [{"groupVersion": format!("{g}/v1"), "version": "v1"}],
                        "preferredVersion": {"groupVersion": format!("{g}/v1"), "version": "v1"},
                    })
                })
                .collect();
            return Route::Root(
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            );
        }
        ["api", "v1"] => return Route::Root(resource_list("", "v1")),
        ["apis", g] if resources::groups().contains(g) => {
            return Route::Root(json!({
                "kind": "APIGroup", "apiVersion": "v1", "name": g,
                "versions": [{"groupVersion": format!("{g}/v1"), "version": "v1"}],
                "preferredVersion": {"groupVersion": format!("{g}/v1"), "version": "v1"},
            }));
        }
        ["apis", g, v] if resources::groups().contains(g) => {
            return Route::Root(resource_list(g, v));
        }
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => return Route::TokenReview,
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] => {
            return Route::AccessReview;
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Route::NotFound,
    };
    let target = |plural: &str, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| {
        resources::find(group, version, plural).map(|res| {
            Route::Resource(Target {
                res,
                namespace: ns.map(str::to_string),
                name: name.map(str::to_string),
                sub: sub.unwrap_or("").to_string(),
            })
        })
    };
    let r = match rest {
        ["namespaces", name, sub] if group.is_empty() && matches!(*sub, "status" | "finalize") => {
            target("namespaces", None, Some(name), Some(sub))
        }
        ["namespaces", ns, plural] => target(plural, Some(ns), None, None),
        ["namespaces", ns, plural, name] => target(plural, Some(ns), Some(name), None),
        ["namespaces", ns, plural, name, sub] => target(plural, Some(ns), Some(name), Some(sub)),
        [plural] => target(plural, None, None, None),
        [plural, name] => target(plural, None, Some(name), None),
        [plural, name, sub] => target(plural, None, Some(name), Some(sub)),
        _ => None,
    };
    r.unwrap_or(Route::NotFound)
}

async fn read_json(req: Request<Incoming>) -> Result<Value, ApiError> {
    let bytes = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading request body: {e}")))?
        .to_bytes();
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized or could not be decoded: {e} (only JSON bodies are served here)"
        ))
    })
}

/// One HTTP request.
pub async fn handle(
    shared: Arc<Shared>,
    peer: Option<(String, Vec<String>)>,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query_raw = req.uri().query().unwrap_or("").to_string();
    let (user, resp) = match authenticate(&shared, &peer, &req) {
        Err(e) => (String::new(), error(&e)),
        Ok(user) => {
            let fault = {
                let mut st = shared.store();
                let hit = st.faults.iter_mut().find(|f| {
                    f.remaining > 0
                        && path.starts_with(&f.path_prefix)
                        && f.method
                            .as_deref()
                            .is_none_or(|m| m.eq_ignore_ascii_case(method.as_str()))
                });
                hit.map(|f| {
                    f.remaining -= 1;
                    f.code
                })
            };
            let resp = match fault {
                Some(code) => error(&ApiError::injected(code)),
                None => dispatch(&shared, &user, req, &path, &query_raw).await,
            };
            (user.name, resp)
        }
    };
    let mut st = shared.store();
    if st.requests.len() < MAX_REQUESTS_LOGGED {
        st.requests.push(RequestRecord {
            method: method.to_string(),
            path,
            query: query_raw,
            user,
            code: resp.status().as_u16(),
        });
    }
    resp
}

/// `nodes/{name}/proxy/...`: authorized as the `nodes/proxy` subresource, then proxied.
async fn node_proxy(
    shared: &Arc<Shared>,
    user: &UserInfo,
    req: Request<Incoming>,
    node: &str,
    below: &str,
    query_raw: &str,
) -> Response<Body> {
    let Some(res) = resources::find("", "v1", "nodes") else {
        return error(&ApiError::internal("no nodes resource"));
    };
    let Some(verb) = super::node_proxy::verb(req.method()) else {
        return error(&ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            req.method()
        )));
    };
    if let Err(e) = authorize(shared, user, res, &attrs(res, verb, "proxy", "", node)) {
        return error(&e);
    }
    let obj = match shared.store().get(res, "", node) {
        Ok(o) => o,
        Err(e) => return error(&e),
    };
    match super::node_proxy::proxy(shared.ca.clone(), &obj, below, query_raw, req).await {
        Ok(r) => r.map(|b| Full::new(b).boxed_unsync()),
        Err(e) => error(&e),
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    user: &UserInfo,
    req: Request<Incoming>,
    path: &str,
    query_raw: &str,
) -> Response<Body> {
    if let Some((node, below)) = super::node_proxy::parse(path) {
        return node_proxy(shared, user, req, &node, &below, query_raw).await;
    }
    let q = parse_query(query_raw);
    let t = match route(path) {
        Route::Version => {
            return full(
                200,
                &json!({
                    "major": "1", "minor": "36",
                    "emulationMajor": "1", "emulationMinor": "36",
                    "minCompatibilityMajor": "1", "minCompatibilityMinor": "35",
                    "gitVersion": shared.git_version, "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.25.0", "compiler": "gc", "platform": "linux/amd64",
                }),
            );
        }
        Route::Healthz => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"ok")).boxed_unsync());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return r;
        }
        Route::Root(v) => return full(200, &v),
        Route::OidcConfig => {
            return full(
                200,
                &json!({
                    "issuer": API_AUDIENCE,
                    "jwks_uri": format!("{API_AUDIENCE}/openid/v1/jwks"),
                    "response_types_supported": ["id_token"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["ES256"],
                }),
            );
        }
        Route::Jwks => {
            let keys = shared.store().token_signer.as_ref().map(|s| s.jwks());
            let mut r = full(200, &keys.unwrap_or_else(|| json!({"keys": []})));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/jwk-set+json"),
            );
            return r;
        }
        Route::NotFound => {
            return error(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        Route::TokenReview | Route::AccessReview if req.method() != Method::POST => {
            return error(&ApiError::new(
                405,
                "MethodNotAllowed",
                "only create is served for reviews",
            ));
        }
        Route::TokenReview => {
            let body = match read_json(req).await {
                Ok(b) => b,
                Err(e) => return error(&e),
            };
            let token = body
                .pointer("/spec/token")
                .and_then(Value::as_str)
                .unwrap_or("");
            let known = shared
                .tokens
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(token)
                .cloned();
            let user = known.or_else(|| shared.store().authenticate_token(token));
            return full(201, &super::reviews::token_review(&body, user));
        }
        Route::AccessReview => {
            let body = match read_json(req).await {
                Ok(b) => b,
                Err(e) => return error(&e),
            };
            return full(201, &super::reviews::access_review(&body, &shared.grants));
        }
        Route::Resource(t) => t,
    };
    let res = t.res;
    if res.group.is_empty() && res.plural == "serviceaccounts" && t.sub == "token" {
        return token_request(shared, user, req, &t).await;
    }
    let is_watch = truthy(q.get("watch"));
    let verb = match (&req.method().clone(), t.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if is_watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        (m, _) => {
            return error(&ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            )));
        }
    };
    let ns = t.namespace.clone().unwrap_or_default();
    let sub = match t.sub.as_str() {
        "" => Subresource::Main,
        "status" if res.status => Subresource::Status,
        "approval" if res.approval => Subresource::Approval,
        "resize" if res.group.is_empty() && res.plural == "pods" => Subresource::Resize,
        "ephemeralcontainers" if res.group.is_empty() && res.plural == "pods" => {
            Subresource::EphemeralContainers
        }
        _ => {
            return error(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
    };
    let name = t.name.clone().unwrap_or_default();
    let labels =
        match LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or("")) {
            Ok(l) => l,
            Err(e) => return error(&e),
        };
    let fields = match FieldSelector::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        res,
    ) {
        Ok(f) => f,
        Err(e) => return error(&e),
    };
    let terms = fields.exact_terms();
    // For list and watch upstream takes the name from a `metadata.name` field selector.
    let authz_name = match verb {
        "list" | "watch" => fields.exact("metadata.name").unwrap_or(""),
        _ => &name,
    };
    let a = Attrs {
        fields: &terms,
        ..attrs(res, verb, &t.sub, &ns, authz_name)
    };
    if let Err(e) = authorize(shared, user, res, &a) {
        return error(&e);
    }
    let ns_filter = t.namespace.as_deref().filter(|_| res.namespaced);
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();

    let result: Result<(u16, Value), ApiError> = match verb {
        "get" => shared.store().get(res, &ns, &name).map(|v| (200, v)),
        "list" => {
            if let Some(rv) = q.get("resourceVersion")
                && q.get("resourceVersionMatch").map(String::as_str) == Some("Exact")
                && rv
                    .parse::<u64>()
                    .is_ok_and(|n| n < shared.store().resource_version())
            {
                // Exact reads of the past are not kept (etcd compaction analogue).
                Err(ApiError::expired(format!("too old resource version: {rv}")))
            } else {
                let limit = q.get("limit").and_then(|l| l.parse().ok());
                shared
                    .store()
                    .list(
                        res,
                        ns_filter,
                        &labels,
                        &fields,
                        limit,
                        q.get("continue").map(String::as_str),
                    )
                    .map(|v| (200, v))
            }
        }
        "watch" => return watch(shared, res, ns_filter, labels, fields, &q),
        "create" => match read_json(req).await {
            Ok(body) => shared
                .store()
                .create(res, &ns, body, user)
                .map(|v| (201, v)),
            Err(e) => Err(e),
        },
        "update" => match read_json(req).await {
            Ok(body) => {
                let mut st = shared.store();
                let existed = st.get(res, &ns, &name).is_ok();
                st.update(res, &ns, &name, body, sub, false, user)
                    .map(|v| (if existed { 200 } else { 201 }, v))
            }
            Err(e) => Err(e),
        },
        "patch" => match read_json(req).await {
            Ok(body) => {
                let mut st = shared.store();
                let existed = st.get(res, &ns, &name).is_ok();
                st.patch(res, &ns, &name, &content_type, &body, sub, user)
                    .map(|v| (if existed { 200 } else { 201 }, v))
            }
            Err(e) => Err(e),
        },
        "delete" => match read_json(req).await {
            Ok(body) => {
                let opts = delete_opts(&q, &body);
                let mut st = shared.store();
                st.get(res, &ns, &name)
                    .and_then(|old| super::authz::restriction::admit_delete(user, res, &old))
                    .and_then(|()| st.delete(res, &ns, &name, &opts))
                    .map(|(obj, _gone)| (200, deleted_response(res, obj)))
            }
            Err(e) => Err(e),
        },
        "deletecollection" => match read_json(req).await {
            Ok(body) => {
                let opts = delete_opts(&q, &body);
                let mut st = shared.store();
                let victims = st.select(res, ns_filter, &labels, &fields);
                let mut items = Vec::new();
                for v in victims {
                    let vns = v
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    let vname = v
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    if let Ok((obj, _)) = st.delete(res, &vns, &vname, &opts) {
                        items.push(obj);
                    }
                }
                Ok((
                    200,
                    json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
                           "metadata": {"resourceVersion": st.resource_version().to_string()}, "items": items}),
                ))
            }
            Err(e) => Err(e),
        },
        _ => Err(ApiError::method_not_allowed("unsupported verb")),
    };
    match result {
        Ok((code, v)) => full(code, &v),
        Err(e) => error(&e),
    }
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`.
async fn token_request(
    shared: &Arc<Shared>,
    user: &UserInfo,
    req: Request<Incoming>,
    t: &Target,
) -> Response<Body> {
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    if req.method() != Method::POST || name.is_empty() {
        return error(&ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            req.method()
        )));
    }
    if let Err(e) = authorize(
        shared,
        user,
        t.res,
        &attrs(t.res, "create", "token", &ns, &name),
    ) {
        return error(&e);
    }
    let result = match read_json(req).await {
        Ok(body) => shared.store().token_request(&ns, &name, &body, user),
        Err(e) => Err(e),
    };
    match result {
        Ok(v) => full(201, &v),
        Err(e) => error(&e),
    }
}

/// Pods come back as the object; other kinds as a Success Status (ReturnDeletedObject).
fn deleted_response(res: &ResourceDef, obj: Value) -> Value {
    if res.plural == "pods" || obj.pointer("/metadata/deletionTimestamp").is_some() {
        return obj;
    }
    let mut details = json!({
        "name": obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
        "kind": res.plural,
        "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
    });
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

fn delete_opts(q: &HashMap<String, String>, body: &Value) -> DeleteOpts {
    let mut o = DeleteOpts {
        grace_period_seconds: q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
        ..Default::default()
    };
    if let Some(g) = body.get("gracePeriodSeconds").and_then(Value::as_i64) {
        o.grace_period_seconds = Some(g);
    }
    if let Some(u) = body.pointer("/preconditions/uid").and_then(Value::as_str) {
        o.precondition_uid = Some(u.to_string());
    }
    if let Some(r) = body
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
    {
        o.precondition_rv = Some(r.to_string());
    }
    o
}

struct WatchStream {
    rx: UnboundedReceiver<WatchMsg>,
    shared: Arc<Shared>,
    id: u64,
    deadline: tokio::time::Instant,
    bookmarks: Option<tokio::time::Interval>,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.store().forget_watcher(self.id);
    }
}

async fn tick(i: &mut Option<tokio::time::Interval>) {
    match i {
        Some(i) => {
            i.tick().await;
        }
        None => futures::future::pending::<()>().await,
    }
}

fn watch(
    shared: &Arc<Shared>,
    res: &'static ResourceDef,
    ns: Option<&str>,
    labels: LabelSelector,
    fields: FieldSelector,
    q: &HashMap<String, String>,
) -> Response<Body> {
    let rv = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") => None,
        Some(s) => match s.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return error(&ApiError::bad_request(format!(
                    "invalid resource version: {s}"
                )));
            }
        },
    };
    let bookmarks = truthy(q.get("allowWatchBookmarks"));
    let initial = truthy(q.get("sendInitialEvents"));
    if initial && !bookmarks {
        return error(&ApiError::invalid(
            "ListOptions",
            "",
            "allowWatchBookmarks",
            "FieldValueRequired",
            "Required value: allowWatchBookmarks must be set to true when sendInitialEvents is specified",
        ));
    }
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(shared.default_watch_timeout);
    let (id, _tx, rx) = shared
        .store()
        .watch(res, ns, labels, fields, rv, initial, bookmarks);
    let period = shared.bookmark_interval;
    let state = WatchStream {
        rx,
        shared: shared.clone(),
        id,
        deadline: tokio::time::Instant::now() + timeout,
        bookmarks: bookmarks
            .then(|| tokio::time::interval_at(tokio::time::Instant::now() + period, period)),
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            tokio::select! {
                m = st.rx.recv() => match m {
                    Some(WatchMsg::Line(b)) => return Some((Ok::<_, Infallible>(Frame::data(b)), st)),
                    Some(WatchMsg::Close) | None => return None,
                },
                _ = tokio::time::sleep_until(st.deadline) => return None,
                _ = tick(&mut st.bookmarks) => st.shared.store().bookmark(st.id),
            }
        }
    });
    let mut r = Response::new(StreamBody::new(stream.boxed()).boxed_unsync());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Accept TLS connections until the task is aborted; connection tasks die with it.
pub async fn serve(listener: TcpListener, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((tcp, _)) = r else { continue };
                let acceptor = acceptor.clone();
                let shared = shared.clone();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let peer = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| identity_of(c.as_ref()));
                    let svc = service_fn(move |req| {
                        let shared = shared.clone();
                        let peer = peer.clone();
                        async move { Ok::<_, Infallible>(handle(shared, peer, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Bind `addr`, retrying briefly while the old socket is still being torn down.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("bind failed")))
}
