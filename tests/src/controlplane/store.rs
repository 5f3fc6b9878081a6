//! The object store: one resourceVersion counter for everything (like etcd's
//! revision), a bounded event history for resuming watches, live watchers with
//! selector-aware event translation, the type-specific create/update/delete
//! semantics the node agent depends on, and the CSR approver + signer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::patch;
use super::pki::{Authority, inspect_csr};
use super::random::random_u64;
use super::resources::{RESOURCES, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn new(name: &str, groups: &[&str]) -> Self {
        Self {
            name: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
}

fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

fn random_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHA[(r % ALPHA.len() as u64) as usize] as char;
            r /= ALPHA.len() as u64;
            c
        })
        .collect()
}

/// RFC 3339 timestamp with second precision (metav1.Time).
pub fn timestamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// A message to one watch stream.
#[derive(Debug)]
pub enum WatchMsg {
    /// One newline-terminated JSON event (or an injected raw line).
    Line(Bytes),
    /// End the stream.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug)]
struct HistoryEvent {
    res: &'static ResourceDef,
    kind: EventType,
    rv: u64,
    obj: Value,
    prev: Option<Value>,
}

#[derive(Debug)]
struct Watcher {
    id: u64,
    res: &'static ResourceDef,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    tx: UnboundedSender<WatchMsg>,
}

impl Watcher {
    fn passes(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// Upstream's cacheWatcher translation: an object that starts matching is
    /// ADDED, one that stops matching is DELETED (old content, new resourceVersion).
    fn translate(&self, ev: &HistoryEvent) -> Option<Bytes> {
        if ev.res.qualified() != self.res.qualified() {
            return None;
        }
        let cur = ev.kind != EventType::Deleted && self.passes(&ev.obj);
        let old = ev.prev.as_ref().is_some_and(|p| self.passes(p));
        let (ty, obj) = match (cur, old) {
            (true, false) => ("ADDED", ev.obj.clone()),
            (true, true) => ("MODIFIED", ev.obj.clone()),
            (false, true) => {
                let mut o = ev.prev.clone().unwrap_or(Value::Null);
                set_rv(&mut o, ev.rv);
                ("DELETED", o)
            }
            (false, false) => return None,
        };
        Some(event_line(ty, &obj))
    }
}

/// One serialized watch event line.
pub fn event_line(ty: &str, obj: &Value) -> Bytes {
    let mut s = serde_json::to_vec(&json!({ "type": ty, "object": obj })).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

fn meta<'a>(obj: &'a Value, field: &str) -> Option<&'a Value> {
    obj.get("metadata").and_then(|m| m.get(field))
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj, field).and_then(Value::as_str).unwrap_or("")
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata object")
}

/// A request counted by the fault injector.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<String>,
    pub path_prefix: String,
    pub remaining: usize,
    pub code: u16,
}

/// One served request, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub user: String,
    pub code: u16,
}

/// How a write reaches an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
    Approval,
}

/// The effective delete options (query + DeleteOptions body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// Settings the store needs from the control-plane options.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub history: usize,
    pub auto_approve_csrs: bool,
    pub cluster_signing_duration: Duration,
    pub min_signing_duration: Duration,
    pub cert_backdate: Duration,
}

/// Everything behind the control plane's lock.
#[derive(Debug)]
pub struct Store {
    pub config: StoreConfig,
    rv: u64,
    objects: HashMap<String, BTreeMap<(String, String), Value>>,
    history: VecDeque<HistoryEvent>,
    compacted: u64,
    watchers: Vec<Watcher>,
    next_watcher: u64,
    pub faults: Vec<Fault>,
    pub requests: Vec<RequestRecord>,
    next_cluster_ip: u32,
    next_node_port: u32,
    /// The CA the CSR signer uses.
    pub signer: Option<std::sync::Arc<Authority>>,
}

fn key_of(ns: &str, name: &str) -> (String, String) {
    (ns.to_string(), name.to_string())
}

fn ns_of(res: &ResourceDef, ns: &str) -> String {
    if res.namespaced {
        ns.to_string()
    } else {
        String::new()
    }
}

/// An object without metadata and status, to tell spec changes (generation bumps).
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("kind");
        m.remove("apiVersion");
    }
    o
}

impl Store {
    pub fn new(config: StoreConfig) -> Self {
        Self {
            config,
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            watchers: Vec::new(),
            next_watcher: 1,
            faults: Vec::new(),
            requests: Vec::new(),
            next_cluster_ip: 10,
            next_node_port: 30000,
            signer: None,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn table(&mut self, res: &ResourceDef) -> &mut BTreeMap<(String, String), Value> {
        self.objects.entry(res.qualified()).or_default()
    }

    fn lookup(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&res.qualified())
            .and_then(|t| t.get(&key_of(&ns_of(res, ns), name)))
    }

    /// Record a change: bump the revision, store or remove the object, keep it in
    /// the history and hand it to the watchers.
    fn commit(
        &mut self,
        res: &'static ResourceDef,
        kind: EventType,
        mut obj: Value,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        let rv = self.rv;
        set_rv(&mut obj, rv);
        let key = key_of(meta_str(&obj, "namespace"), meta_str(&obj, "name"));
        if kind == EventType::Deleted {
            self.table(res).remove(&key);
        } else {
            self.table(res).insert(key, obj.clone());
        }
        let ev = HistoryEvent {
            res,
            kind,
            rv,
            obj: obj.clone(),
            prev,
        };
        self.watchers.retain(|w| match w.translate(&ev) {
            Some(line) => w.tx.send(WatchMsg::Line(line)).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(ev);
        while self.history.len() > self.config.history.max(1) {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        obj
    }

    /// Drop the whole event history: any older resourceVersion now answers 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    // -- reads ---------------------------------------------------------------

    pub fn get(&self, res: &'static ResourceDef, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lookup(res, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// Matching objects, in (namespace, name) order.
    pub fn select(
        &self,
        res: &'static ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<Value> {
        let Some(t) = self.objects.get(&res.qualified()) else {
            return Vec::new();
        };
        t.values()
            .filter(|o| ns.is_none_or(|n| !res.namespaced || meta_str(o, "namespace") == n))
            .filter(|o| labels.matches(o) && fields.matches(o))
            .cloned()
            .collect()
    }

    /// A `<Kind>List`, paged by `limit`/`continue` like the apiserver.
    #[allow(clippy::too_many_arguments)]
    pub fn list(
        &self,
        res: &'static ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<Value, ApiError> {
        let mut items = self.select(res, ns, labels, fields);
        let mut list_rv = self.rv;
        if let Some(tok) = continue_token.filter(|t| !t.is_empty()) {
            let bad = || {
                ApiError::bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                )
            };
            let raw = B64.decode(tok).map_err(|_| bad())?;
            let c: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
            let rv = c.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
            let start = c
                .get("start")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if rv < self.compacted {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response.",
                ));
            }
            items.retain(|o| {
                format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name")) > start
            });
            list_rv = rv;
        }
        let mut cont = None;
        if let Some(l) = limit.filter(|l| *l > 0)
            && items.len() > l
        {
            items.truncate(l);
            let last = items
                .last()
                .map(|o| format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name")));
            let tok = json!({ "v": "meta.k8s.io/v1", "rv": list_rv, "start": last });
            cont = Some(B64.encode(serde_json::to_vec(&tok).unwrap_or_default()));
        }
        for o in &mut items {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
        }
        let mut lm = json!({ "resourceVersion": list_rv.to_string() });
        if let Some(c) = cont {
            lm["continue"] = json!(c);
        }
        Ok(json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(),
            "metadata": lm,
            "items": items,
        }))
    }

    // -- watch ---------------------------------------------------------------

    /// Register a watcher. `resource_version`: `None`/`0` start with synthetic
    /// ADDED events for the current state; `n` replays history after `n`, or
    /// sends one ERROR event (410 Expired) when `n` is older than the history.
    #[allow(clippy::too_many_arguments)]
    pub fn watch(
        &mut self,
        res: &'static ResourceDef,
        ns: Option<&str>,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: Option<u64>,
        send_initial_events: bool,
        allow_bookmarks: bool,
    ) -> (u64, UnboundedSender<WatchMsg>, UnboundedReceiver<WatchMsg>) {
        let (tx, rx) = unbounded_channel();
        let id = self.next_watcher;
        self.next_watcher += 1;
        let w = Watcher {
            id,
            res,
            namespace: ns.filter(|_| res.namespaced).map(str::to_string),
            labels,
            fields,
            tx: tx.clone(),
        };
        match resource_version {
            Some(n) if n > 0 && !send_initial_events => {
                if n < self.compacted {
                    let err = ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted
                    ));
                    let _ = tx.send(WatchMsg::Line(event_line("ERROR", &err.to_status())));
                    let _ = tx.send(WatchMsg::Close);
                    return (id, tx, rx);
                }
                for ev in self.history.iter().filter(|e| e.rv > n) {
                    if let Some(line) = w.translate(ev) {
                        let _ = tx.send(WatchMsg::Line(line));
                    }
                }
            }
            _ => {
                let current = self.select(res, w.namespace.as_deref(), &w.labels, &w.fields);
                for o in &current {
                    let _ = tx.send(WatchMsg::Line(event_line("ADDED", o)));
                }
                if send_initial_events && allow_bookmarks {
                    let bm = self.bookmark_object(res, true);
                    let _ = tx.send(WatchMsg::Line(event_line("BOOKMARK", &bm)));
                }
            }
        }
        self.watchers.push(w);
        (id, tx, rx)
    }

    fn bookmark_object(&self, res: &ResourceDef, initial_end: bool) -> Value {
        let mut m = json!({ "resourceVersion": self.rv.to_string() });
        if initial_end {
            m["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        json!({ "kind": res.kind, "apiVersion": res.api_version(), "metadata": m })
    }

    /// Queue a BOOKMARK at the current revision on one watcher (ordered after
    /// every event already sent to it).
    pub fn bookmark(&mut self, watcher: u64) {
        if let Some(w) = self.watchers.iter().find(|w| w.id == watcher) {
            let bm = self.bookmark_object(w.res, false);
            let _ = w.tx.send(WatchMsg::Line(event_line("BOOKMARK", &bm)));
        }
    }

    pub fn forget_watcher(&mut self, watcher: u64) {
        self.watchers.retain(|w| w.id != watcher);
    }

    /// Send a raw line (e.g. malformed JSON) to the watchers of `res` (all when None).
    pub fn inject_watch_line(&mut self, res: Option<&ResourceDef>, line: &str) -> usize {
        let mut l = line.as_bytes().to_vec();
        if !l.ends_with(b"\n") {
            l.push(b'\n');
        }
        let line = Bytes::from(l);
        let mut n = 0;
        for w in &self.watchers {
            if res.is_none_or(|r| r.qualified() == w.res.qualified())
                && w.tx.send(WatchMsg::Line(line.clone())).is_ok()
            {
                n += 1;
            }
        }
        n
    }

    /// End the watch streams of `res` (all when None), as an apiserver does on shutdown.
    pub fn close_watches(&mut self, res: Option<&ResourceDef>) -> usize {
        let before = self.watchers.len();
        self.watchers.retain(|w| {
            if res.is_none_or(|r| r.qualified() == w.res.qualified()) {
                let _ = w.tx.send(WatchMsg::Close);
                false
            } else {
                true
            }
        });
        before - self.watchers.len()
    }

    pub fn watcher_count(&self, res: Option<&ResourceDef>) -> usize {
        self.watchers
            .iter()
            .filter(|w| !w.tx.is_closed() && res.is_none_or(|r| r.qualified() == w.res.qualified()))
            .count()
    }

    // -- writes --------------------------------------------------------------

    fn check_type(res: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        if let Some(k) = obj.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != res.kind
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({}) or kind {k} is not {}",
                obj.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                res.api_version(),
                res.kind
            )));
        }
        if let Some(v) = obj.get("apiVersion").and_then(Value::as_str)
            && !v.is_empty()
            && v != res.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                res.api_version()
            )));
        }
        Ok(())
    }

    /// POST semantics.
    pub fn create(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        mut obj: Value,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        Self::check_type(res, &obj)?;
        let ns = ns_of(res, ns);
        {
            let body_ns = meta_str(&obj, "namespace").to_string();
            if res.namespaced && !body_ns.is_empty() && !ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            let ns_final = if ns.is_empty() { body_ns } else { ns.clone() };
            let m = meta_mut(&mut obj);
            if res.namespaced {
                let ns_final = if ns_final.is_empty() {
                    "default".to_string()
                } else {
                    ns_final
                };
                m.insert("namespace".into(), json!(ns_final));
            } else {
                m.remove("namespace");
            }
        }
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let gen_name = meta_str(&obj, "generateName").to_string();
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    res.kind,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{gen_name}{}", random_suffix());
        }
        let ns = meta_str(&obj, "namespace").to_string();
        if self.lookup(res, &ns, &name).is_some() {
            return Err(ApiError::already_exists(res, &name));
        }
        let now = SystemTime::now();
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(timestamp(now)));
            m.insert("generation".into(), json!(1));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("resourceVersion");
            m.remove("selfLink");
        }
        obj["kind"] = json!(res.kind);
        obj["apiVersion"] = json!(res.api_version());
        self.defaults_on_create(res, &mut obj, user)?;
        let out = self.commit(res, EventType::Added, obj, None);
        self.after_write(res, &ns, &name);
        Ok(out)
    }

    /// Type-specific defaulting and PrepareForCreate.
    fn defaults_on_create(
        &mut self,
        res: &ResourceDef,
        obj: &mut Value,
        user: &UserInfo,
    ) -> Result<(), ApiError> {
        match (res.group, res.plural) {
            ("", "pods") => {
                let spec = obj
                    .get_mut("spec")
                    .and_then(Value::as_object_mut)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "Pod",
                            "",
                            "spec.containers",
                            "FieldValueRequired",
                            "Required value",
                        )
                    })?;
                for (k, v) in [
                    ("terminationGracePeriodSeconds", json!(30)),
                    ("restartPolicy", json!("Always")),
                    ("dnsPolicy", json!("ClusterFirst")),
                    ("schedulerName", json!("default-scheduler")),
                    ("securityContext", json!({})),
                    ("enableServiceLinks", json!(true)),
                ] {
                    spec.entry(k).or_insert(v);
                }
                for list in ["containers", "initContainers"] {
                    if let Some(Value::Array(cs)) = spec.get_mut(list) {
                        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                            let image = c
                                .get("image")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string();
                            let tag = image.rsplit('/').next().unwrap_or("");
                            let pull = if !tag.contains(':') || tag.ends_with(":latest") {
                                "Always"
                            } else {
                                "IfNotPresent"
                            };
                            c.entry("imagePullPolicy").or_insert(json!(pull));
                            c.entry("terminationMessagePath")
                                .or_insert(json!("/dev/termination-log"));
                            c.entry("terminationMessagePolicy").or_insert(json!("File"));
                            c.entry("resources").or_insert(json!({}));
                        }
                    }
                }
                let qos = pod_qos(obj);
                obj["status"] = json!({ "phase": "Pending", "qosClass": qos });
            }
            ("", "namespaces") => {
                obj["status"] = json!({ "phase": "Active" });
                if obj.pointer("/spec/finalizers").is_none() {
                    obj["spec"] = json!({ "finalizers": ["kubernetes"] });
                }
            }
            ("", "services") => self.default_service(obj),
            ("certificates.k8s.io", _) => {
                let name = meta_str(obj, "name").to_string();
                validate_csr(obj, &name)?;
                let spec = obj["spec"].as_object_mut().expect("validated spec");
                spec.insert("username".into(), json!(user.name));
                let mut groups = user.groups.clone();
                if !groups.iter().any(|g| g == "system:authenticated") {
                    groups.push("system:authenticated".into());
                }
                spec.insert("groups".into(), json!(groups));
                obj["status"] = json!({});
            }
            _ => {}
        }
        Ok(())
    }

    fn default_service(&mut self, obj: &mut Value) {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let spec = obj["spec"].as_object_mut().expect("spec");
        let ty = spec
            .entry("type")
            .or_insert(json!("ClusterIP"))
            .as_str()
            .unwrap_or("ClusterIP")
            .to_string();
        spec.entry("sessionAffinity").or_insert(json!("None"));
        if ty != "ExternalName" {
            let ip = spec
                .get("clusterIP")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let ip = if ip.is_empty() {
                let n = self.next_cluster_ip;
                self.next_cluster_ip += 1;
                format!("10.96.{}.{}", n / 256, n % 256)
            } else {
                ip
            };
            spec.insert("clusterIP".into(), json!(ip));
            spec.entry("clusterIPs").or_insert(json!([ip]));
            if ip != "None" {
                spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
                spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
            }
            spec.entry("internalTrafficPolicy")
                .or_insert(json!("Cluster"));
        }
        let node_ports = ty == "NodePort" || ty == "LoadBalancer";
        if node_ports {
            spec.entry("externalTrafficPolicy")
                .or_insert(json!("Cluster"));
        }
        if let Some(Value::Array(ports)) = spec.get_mut("ports") {
            for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                p.entry("protocol").or_insert(json!("TCP"));
                if let Some(port) = p.get("port").cloned() {
                    p.entry("targetPort").or_insert(port);
                }
                if node_ports && p.get("nodePort").is_none() {
                    p.insert("nodePort".into(), json!(self.next_node_port));
                    self.next_node_port += 1;
                }
            }
        }
        if obj.get("status").is_none() {
            obj["status"] = json!({ "loadBalancer": {} });
        }
    }

    /// PUT semantics (also the last step of PATCH).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        mut new: Value,
        sub: Subresource,
        from_patch: bool,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        Self::check_type(res, &new)?;
        let ns = ns_of(res, ns);
        let body_name = meta_str(&new, "name").to_string();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let Some(existing) = self.lookup(res, &ns, name).cloned() else {
            if res.create_on_update && sub == Subresource::Main {
                meta_mut(&mut new).insert("name".into(), json!(name));
                return self.create(res, &ns, new, user);
            }
            return Err(ApiError::not_found(res, name));
        };
        let rv = meta_str(&new, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&existing, "resourceVersion") {
            return Err(ApiError::stale(res, name));
        }
        let uid = meta_str(&new, "uid");
        let old_uid = meta_str(&existing, "uid");
        if !uid.is_empty() && uid != old_uid {
            if from_patch {
                return Err(ApiError::invalid(
                    res.kind,
                    name,
                    "metadata.uid",
                    "FieldValueInvalid",
                    &format!("Invalid value: \"{uid}\": field is immutable"),
                ));
            }
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        let mut result = match sub {
            Subresource::Main => {
                let mut r = new;
                if res.status || res.approval {
                    match existing.get("status") {
                        Some(s) => r["status"] = s.clone(),
                        None => {
                            if let Some(m) = r.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                r
            }
            Subresource::Status => {
                let mut r = new;
                match existing.get("spec") {
                    Some(s) => r["spec"] = s.clone(),
                    None => {
                        if let Some(m) = r.as_object_mut() {
                            m.remove("spec");
                        }
                    }
                }
                if let Some(o) = meta(&existing, "ownerReferences") {
                    meta_mut(&mut r).insert("ownerReferences".into(), o.clone());
                }
                if res.approval {
                    // The CSR status endpoint may set the certificate; conditions too.
                }
                r
            }
            Subresource::Approval => {
                let mut r = existing.clone();
                let conds = new
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or(json!([]));
                if !r.get("status").is_some_and(Value::is_object) {
                    r["status"] = json!({});
                }
                r["status"]["conditions"] = conds;
                r
            }
        };
        // System-owned metadata survives every update.
        {
            let m = meta_mut(&mut result);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match meta(&existing, f) {
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
            m.insert("name".into(), json!(name));
            if res.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert(
                "resourceVersion".into(),
                json!(meta_str(&existing, "resourceVersion")),
            );
        }
        result["kind"] = json!(res.kind);
        result["apiVersion"] = json!(res.api_version());
        if res.approval {
            stamp_conditions(&mut result);
        }
        if spec_part(&result) != spec_part(&existing) {
            let g = meta(&existing, "generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut result).insert("generation".into(), json!(g + 1));
        }
        if result == existing {
            // No change, no write: same resourceVersion, no watch event.
            return Ok(existing);
        }
        // Finalizers gone on an object being deleted: it goes away now.
        let finalizers_empty = meta(&result, "finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
        let out = if meta(&result, "deletionTimestamp").is_some()
            && finalizers_empty
            && (res.plural != "pods"
                || meta(&result, "deletionGracePeriodSeconds").and_then(Value::as_i64) == Some(0))
        {
            self.commit(res, EventType::Deleted, result, Some(existing))
        } else {
            self.commit(res, EventType::Modified, result, Some(existing))
        };
        self.after_write(res, &ns, name);
        Ok(out)
    }

    /// PATCH semantics; `apply` (server-side apply) creates a missing object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        content_type: &str,
        body: &Value,
        sub: Subresource,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        let ct = content_type.split(';').next().unwrap_or("").trim();
        let existing = match self.lookup(res, &ns_of(res, ns), name).cloned() {
            Some(e) => e,
            None if ct == "application/apply-patch+yaml" && sub == Subresource::Main => {
                let mut obj = body.clone();
                meta_mut(&mut obj).insert("name".into(), json!(name));
                return self.create(res, ns, obj, user);
            }
            None => return Err(ApiError::not_found(res, name)),
        };
        let mut merged = existing.clone();
        match ct {
            "application/merge-patch+json" => patch::merge_patch(&mut merged, body),
            "application/strategic-merge-patch+json" | "application/apply-patch+yaml" => {
                patch::strategic_merge(&mut merged, body)?
            }
            "application/json-patch+json" => patch::json_patch(&mut merged, body)?,
            other => return Err(ApiError::unsupported_media_type(other)),
        }
        if ct == "application/apply-patch+yaml"
            && let Some(m) = merged.get_mut("metadata").and_then(Value::as_object_mut)
        {
            // Apply has no optimistic lock unless the patch itself names a version.
            if meta(body, "resourceVersion").is_none() {
                m.insert(
                    "resourceVersion".into(),
                    json!(meta_str(&existing, "resourceVersion")),
                );
            }
        }
        self.update(res, ns, name, merged, sub, true, user)
    }

    /// DELETE semantics. Returns the object (removed or now terminating) and
    /// whether it is gone.
    pub fn delete(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let ns = ns_of(res, ns);
        let existing = self
            .lookup(res, &ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if let Some(uid) = &opts.precondition_uid
            && uid != meta_str(&existing, "uid")
        {
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&existing, "uid")
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != meta_str(&existing, "resourceVersion")
        {
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&existing, "resourceVersion")
                ),
            ));
        }
        // Pod graceful deletion (podStrategy.CheckGracefulDelete).
        let mut period = 0i64;
        if res.group.is_empty() && res.plural == "pods" {
            period = opts.grace_period_seconds.unwrap_or_else(|| {
                existing
                    .pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
            });
            let node = existing
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            let phase = existing
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
                period = 0;
            }
            if period < 0 {
                period = 1;
            }
        }
        let has_finalizers = meta(&existing, "finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let now = SystemTime::now();
        if period > 0 || has_finalizers {
            let current = meta(&existing, "deletionGracePeriodSeconds").and_then(Value::as_i64);
            if meta(&existing, "deletionTimestamp").is_some()
                && current.is_some_and(|c| c <= period)
            {
                // Deletion already under way with a shorter or equal grace period.
                return Ok((existing, false));
            }
            let mut obj = existing.clone();
            let m = meta_mut(&mut obj);
            m.insert(
                "deletionTimestamp".into(),
                json!(timestamp(
                    now + Duration::from_secs(u64::try_from(period).unwrap_or(0))
                )),
            );
            m.insert("deletionGracePeriodSeconds".into(), json!(period));
            if period == 0 && !has_finalizers {
                let out = self.commit(res, EventType::Deleted, obj, Some(existing));
                return Ok((out, true));
            }
            let out = self.commit(res, EventType::Modified, obj, Some(existing));
            return Ok((out, false));
        }
        let out = self.commit(res, EventType::Deleted, existing.clone(), Some(existing));
        Ok((out, true))
    }

    // -- the CSR approver and signer (kube-controller-manager's job) ----------

    fn after_write(&mut self, res: &'static ResourceDef, ns: &str, name: &str) {
        if res.approval {
            self.csr_controller(res, name);
        }
        let _ = ns;
    }

    fn csr_controller(&mut self, res: &'static ResourceDef, name: &str) {
        let Some(csr) = self.lookup(res, "", name).cloned() else {
            return;
        };
        if csr
            .pointer("/status/certificate")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty())
        {
            return;
        }
        let has = |t: &str| {
            csr.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.get("type").and_then(Value::as_str) == Some(t))
                })
        };
        if has("Denied") || has("Failed") {
            return;
        }
        let signer = csr
            .pointer("/spec/signerName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let Some(pem) = csr
            .pointer("/spec/request")
            .and_then(Value::as_str)
            .and_then(|r| B64.decode(r).ok())
            .and_then(|b| String::from_utf8(b).ok())
        else {
            return;
        };
        let usages: Vec<String> = csr
            .pointer("/spec/usages")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !has("Approved") {
            if !self.config.auto_approve_csrs
                || signer != "kubernetes.io/kube-apiserver-client-kubelet"
            {
                return;
            }
            let Ok(info) = inspect_csr(&pem) else { return };
            let mut u = usages.clone();
            u.sort();
            u.dedup();
            let usages_ok = u == ["client auth", "digital signature"]
                || u == ["client auth", "digital signature", "key encipherment"];
            let is_node_client = info.organizations == ["system:nodes"]
                && !info.has_sans
                && info.common_name.starts_with("system:node:")
                && usages_ok;
            if !is_node_client {
                return;
            }
            let username = csr
                .pointer("/spec/username")
                .and_then(Value::as_str)
                .unwrap_or("");
            let groups: Vec<&str> = csr
                .pointer("/spec/groups")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let message = if username == info.common_name {
                "Auto approving self kubelet client certificate after SubjectAccessReview."
            } else if groups.contains(&"system:bootstrappers") || groups.contains(&"system:masters")
            {
                "Auto approving kubelet client certificate after SubjectAccessReview."
            } else {
                return;
            };
            let mut next = csr.clone();
            push_condition(&mut next, "Approved", "AutoApproved", message);
            let prev = csr.clone();
            self.commit(res, EventType::Modified, next, Some(prev));
        }
        // Sign (kube-controller-manager's csrsigning controller).
        let signable = [
            "kubernetes.io/kube-apiserver-client-kubelet",
            "kubernetes.io/kube-apiserver-client",
            "kubernetes.io/kubelet-serving",
            "kubernetes.io/legacy-unknown",
        ];
        if !signable.contains(&signer.as_str()) {
            return;
        }
        let Some(csr) = self.lookup(res, "", name).cloned() else {
            return;
        };
        let ttl = signing_duration(
            self.config.cluster_signing_duration,
            self.config.min_signing_duration,
            csr.pointer("/spec/expirationSeconds")
                .and_then(Value::as_u64),
        );
        let Some(ca) = self.signer.clone() else {
            return;
        };
        let mut next = csr.clone();
        match ca.sign_csr(&pem, &usages, ttl, self.config.cert_backdate) {
            Ok(cert) => {
                next["status"]["certificate"] = json!(B64.encode(cert.as_bytes()));
            }
            Err(e) => push_condition(
                &mut next,
                "Failed",
                "SignerValidationFailure",
                &e.to_string(),
            ),
        }
        self.commit(res, EventType::Modified, next, Some(csr));
    }

    /// Every object of every resource (for debugging dumps).
    pub fn dump(&self) -> Vec<Value> {
        RESOURCES
            .iter()
            .flat_map(|r| {
                self.objects
                    .get(&r.qualified())
                    .into_iter()
                    .flat_map(|t| t.values().cloned())
            })
            .collect()
    }
}

/// `signer.duration`: the requested lifetime, at least `min`, at most the cluster default.
fn signing_duration(cluster: Duration, min: Duration, requested: Option<u64>) -> Duration {
    match requested.map(Duration::from_secs) {
        None => cluster,
        Some(r) if r > cluster => cluster,
        Some(r) if r < min => min,
        Some(r) => r,
    }
}

fn push_condition(obj: &mut Value, ty: &str, reason: &str, message: &str) {
    let now = timestamp(SystemTime::now());
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    let conds = obj["status"]
        .as_object_mut()
        .expect("status")
        .entry("conditions")
        .or_insert(json!([]));
    if let Some(a) = conds.as_array_mut() {
        a.push(json!({
            "type": ty,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }));
    }
}

fn stamp_conditions(obj: &mut Value) {
    let now = timestamp(SystemTime::now());
    if let Some(Value::Array(cs)) = obj.pointer_mut("/status/conditions") {
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            c.entry("lastUpdateTime").or_insert(json!(now));
            c.entry("lastTransitionTime").or_insert(json!(now));
            c.entry("status").or_insert(json!("True"));
        }
    }
}

fn validate_csr(obj: &Value, name: &str) -> Result<(), ApiError> {
    let kind = "CertificateSigningRequest";
    let req = obj
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pem = B64
        .decode(req)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    if !pem.contains("-----BEGIN CERTIFICATE REQUEST-----") || inspect_csr(&pem).is_err() {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.request",
            "FieldValueInvalid",
            "Invalid value: \"<bytes>\": PEM block type must be CERTIFICATE REQUEST",
        ));
    }
    if obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.signerName",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if obj
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty())
    {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.usages",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if let Some(e) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && e < 600
    {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.expirationSeconds",
            "FieldValueInvalid",
            &format!(
                "Invalid value: {e}: may not specify a duration less than 600 seconds (10 minutes)"
            ),
        ));
    }
    Ok(())
}

/// The pod's QoS class from its containers' requests and limits.
fn pod_qos(pod: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for list in ["containers", "initContainers"] {
        for c in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let req = c.pointer("/resources/requests").and_then(Value::as_object);
            let lim = c.pointer("/resources/limits").and_then(Value::as_object);
            if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
                any = true;
            }
            for r in ["cpu", "memory"] {
                let l = lim.and_then(|l| l.get(r));
                let q = req.and_then(|q| q.get(r)).or(l);
                if l.is_none() || q != l {
                    guaranteed = false;
                }
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controlplane::resources::find;

    fn store() -> Store {
        Store::new(StoreConfig {
            history: 3,
            auto_approve_csrs: true,
            cluster_signing_duration: Duration::from_secs(3600),
            min_signing_duration: Duration::from_secs(600),
            cert_backdate: Duration::from_secs(300),
        })
    }

    fn admin() -> UserInfo {
        UserInfo::new("admin", &["system:masters"])
    }

    #[test]
    fn selector_transitions_and_expiry() {
        let pods = find("", "v1", "pods").unwrap();
        let mut s = store();
        let fields = FieldSelector::parse("spec.nodeName=n1", pods).unwrap();
        let (_, _, mut rx) = s.watch(
            pods,
            None,
            LabelSelector::default(),
            fields,
            None,
            false,
            true,
        );
        let p = json!({"metadata": {"name": "a", "namespace": "d"}, "spec": {"containers": [], "nodeName": "n2"}});
        s.create(pods, "d", p, &admin()).unwrap();
        s.patch(
            pods,
            "d",
            "a",
            "application/merge-patch+json",
            &json!({"spec": {"nodeName": "n1"}}),
            Subresource::Main,
            &admin(),
        )
        .unwrap();
        s.patch(
            pods,
            "d",
            "a",
            "application/merge-patch+json",
            &json!({"spec": {"nodeName": "n3"}}),
            Subresource::Main,
            &admin(),
        )
        .unwrap();
        let mut types = Vec::new();
        while let Ok(WatchMsg::Line(l)) = rx.try_recv() {
            let v: Value = serde_json::from_slice(&l).unwrap();
            types.push(v["type"].as_str().unwrap().to_string());
        }
        assert_eq!(types, ["ADDED", "DELETED"]);
        for i in 0..5 {
            s.create(
                pods,
                "d",
                json!({"metadata": {"name": format!("p{i}")}, "spec": {}}),
                &admin(),
            )
            .unwrap();
        }
        let (_, _, mut rx) = s.watch(
            pods,
            None,
            LabelSelector::default(),
            FieldSelector::default(),
            Some(2),
            false,
            true,
        );
        let WatchMsg::Line(l) = rx.try_recv().unwrap() else {
            panic!()
        };
        let v: Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["type"], "ERROR");
        assert_eq!(v["object"]["code"], 410);
        assert_eq!(v["object"]["reason"], "Expired");
    }

    #[test]
    fn pod_graceful_delete() {
        let pods = find("", "v1", "pods").unwrap();
        let mut s = store();
        s.create(
            pods,
            "d",
            json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}}),
            &admin(),
        )
        .unwrap();
        let (o, gone) = s.delete(pods, "d", "a", &DeleteOpts::default()).unwrap();
        assert!(!gone);
        assert_eq!(o["metadata"]["deletionGracePeriodSeconds"], 30);
        let (_, gone) = s
            .delete(
                pods,
                "d",
                "a",
                &DeleteOpts {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(gone);
        s.create(
            pods,
            "d",
            json!({"metadata": {"name": "b"}, "spec": {}}),
            &admin(),
        )
        .unwrap();
        let (_, gone) = s.delete(pods, "d", "b", &DeleteOpts::default()).unwrap();
        assert!(gone, "unscheduled pods go at once");
    }

    #[test]
    fn noop_update_keeps_version() {
        let cms = find("", "v1", "configmaps").unwrap();
        let mut s = store();
        let c = s
            .create(
                cms,
                "d",
                json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
                &admin(),
            )
            .unwrap();
        let same = s
            .update(cms, "d", "a", c.clone(), Subresource::Main, false, &admin())
            .unwrap();
        assert_eq!(
            same["metadata"]["resourceVersion"],
            c["metadata"]["resourceVersion"]
        );
        let mut stale = c.clone();
        stale["data"]["k"] = json!("w");
        s.update(
            cms,
            "d",
            "a",
            stale.clone(),
            Subresource::Main,
            false,
            &admin(),
        )
        .unwrap();
        let err = s
            .update(cms, "d", "a", stale, Subresource::Main, false, &admin())
            .unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    }
}
