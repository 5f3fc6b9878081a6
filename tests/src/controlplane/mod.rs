//! An in-process test apiserver speaking the Kubernetes wire protocol over HTTPS.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use node_tests::controlplane::{Options, TestControlPlane};
//! let cp = TestControlPlane::start(Options::default()).await?;
//! let dir = tempfile::tempdir()?;
//! cp.admin_kubeconfig(dir.path().join("admin.conf"))?;          // CN=admin, O=system:masters
//! cp.bootstrap_kubeconfig(dir.path().join("bootstrap.conf"))?;  // token abcdef.0123456789abcdef
//! cp.fail_next("/api/v1/nodes", 3, 500);                        // next 3 node requests fail
//! cp.restart(std::time::Duration::from_secs(2)).await?;         // outage, same port and data
//! # Ok(()) }
//! ```
//!
//! What it is: one resourceVersion counter shared by every object, a bounded
//! event history (watches resuming from older versions get an ERROR event with
//! a 410 `Expired` Status, as upstream's watch cache sends), selector-aware watch
//! event translation, upstream's pod graceful-deletion rules, merge / strategic
//! merge / JSON patches, `/status` and `/approval` subresources, a CSR
//! approver + signer behaving like kube-controller-manager's, the controllers
//! that give every namespace its `kube-root-ca.crt` ConfigMap and `default`
//! ServiceAccount, the ServiceAccount admission plugin on pod create (the
//! `kube-api-access-*` volume; [`Options::service_account_admission`]),
//! TokenRequest with ES256-signed bound tokens that also authenticate requests
//! ([`TestControlPlane::verify_service_account_token`],
//! [`TestControlPlane::token_requests`]), and `node.k8s.io/v1` RuntimeClasses.
//! Every request is authorized as a kubeadm cluster's apiserver does it: the Node
//! authorizer, RBAC over upstream's bootstrap roles and kubeadm's bindings, and the
//! NodeRestriction admission plugin ([`authz`]); the harness's own calls act as
//! `system:masters`. What it is not: any other admission plugin, a scheduler, protobuf, or server-side apply field ownership
//! (apply patches are applied as strategic merges).

pub mod authz;
mod credentials;
pub mod in_netns;
mod jwt;
pub mod node_proxy;
mod patch;
pub mod pki;
mod random;
pub mod resources;
pub mod reviews;
pub mod selectors;
mod server;
pub mod status;
mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub use in_netns::NetnsControlPlane;
pub use pki::{IssuedCert, subject_of_pem, validity_of_pem};
pub use resources::ResourceDef;
pub use status::ApiError;
pub use store::{API_AUDIENCE, RequestRecord, UserInfo};

use server::Shared;
use store::{DeleteOpts, Store, StoreConfig, Subresource};

/// The bootstrap token kubeadm-style clusters hand out in these tests.
pub const BOOTSTRAP_TOKEN: &str = "abcdef.0123456789abcdef";

/// How to start a [`TestControlPlane`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Bootstrap tokens (`<id>.<secret>`); each authenticates as
    /// `system:bootstrap:<id>` in group `system:bootstrappers`.
    pub bootstrap_tokens: Vec<String>,
    /// Watch events kept for resuming watches (older resourceVersions get 410).
    pub history: usize,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (upstream: about a minute).
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds` (upstream: 30–60 min).
    pub default_watch_timeout: Duration,
    /// Approve kubelet client CSRs like kube-controller-manager's csrapproving controller.
    pub auto_approve_csrs: bool,
    /// Approve `kubernetes.io/kubelet-serving` CSRs a node makes for itself (valid as
    /// upstream's `ValidateKubeletServingCSR`, requested by the `system:node:<name>` the CN
    /// names). Off by default, as in kube-controller-manager: tests approve them explicitly.
    pub auto_approve_serving_csrs: bool,
    /// `--cluster-signing-duration`: the longest (and default) certificate lifetime.
    /// Short values force client-certificate rotation in tests.
    pub cluster_signing_duration: Duration,
    /// Lower bound applied to `spec.expirationSeconds` (upstream: 10 min).
    pub min_signing_duration: Duration,
    /// `NotBefore` backdating of signed certificates (upstream: 5 min). Note that a
    /// rotation deadline at 70–90 % of `NotAfter - NotBefore` lands in the past
    /// for lifetimes much shorter than the backdate: use 0 for rotation tests.
    pub cert_backdate: Duration,
    /// Create `default`, `kube-system`, `kube-public` and `kube-node-lease`.
    pub default_namespaces: bool,
    /// `/version` gitVersion.
    pub git_version: String,
    /// The ServiceAccount admission plugin on pod create (on in every real
    /// cluster): default `serviceAccountName`, refuse pods of missing accounts,
    /// inject the `kube-api-access-*` volume. Off: pods are stored as sent.
    pub service_account_admission: bool,
    /// `--service-account-extend-token-expiration` (upstream default true): a
    /// pod-bound token asked for 3607 s is valid a year, with `warnafter` at 3607 s.
    pub extend_token_expiration: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            port: 0,
            bootstrap_tokens: vec![BOOTSTRAP_TOKEN.to_string()],
            history: 1000,
            bookmark_interval: Duration::from_secs(10),
            default_watch_timeout: Duration::from_secs(1800),
            auto_approve_csrs: true,
            auto_approve_serving_csrs: false,
            cluster_signing_duration: Duration::from_secs(365 * 24 * 3600),
            min_signing_duration: Duration::from_secs(600),
            cert_backdate: Duration::from_secs(300),
            default_namespaces: true,
            git_version: "v1.36.0".to_string(),
            service_account_admission: true,
            extend_token_expiration: true,
        }
    }
}

/// The user direct store calls act as.
fn harness_user() -> UserInfo {
    UserInfo::new("system:admin", &["system:masters", "system:authenticated"])
}

/// An in-process apiserver on 127.0.0.1 with its own CA.
pub struct TestControlPlane {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for TestControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestControlPlane")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for TestControlPlane {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

fn resolve(resource: &str) -> Result<&'static ResourceDef, ApiError> {
    resources::by_name(resource).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            format!("the test control plane does not serve {resource:?}"),
        )
    })
}

fn resolve_typed<K: k8s_openapi::Resource>() -> Result<&'static ResourceDef, ApiError> {
    resources::find(K::GROUP, K::VERSION, K::URL_PATH_SEGMENT).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            format!("the test control plane does not serve {}", K::KIND),
        )
    })
}

fn to_typed<K: DeserializeOwned>(v: Value) -> Result<K, ApiError> {
    serde_json::from_value(v)
        .map_err(|e| ApiError::internal(format!("decoding stored object: {e}")))
}

fn yaml_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl TestControlPlane {
    /// Generate the CA and serving certificate, bind 127.0.0.1, start serving.
    pub async fn start(opts: Options) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = Arc::new(pki::Authority::new("kubernetes")?);
        let serving = ca.serving_cert()?;
        let acceptor = tls_acceptor(&ca, &serving)?;
        let mut store = Store::new(StoreConfig {
            history: opts.history,
            auto_approve_csrs: opts.auto_approve_csrs,
            auto_approve_serving_csrs: opts.auto_approve_serving_csrs,
            cluster_signing_duration: opts.cluster_signing_duration,
            min_signing_duration: opts.min_signing_duration,
            cert_backdate: opts.cert_backdate,
            service_account_admission: opts.service_account_admission,
            extend_token_expiration: opts.extend_token_expiration,
        });
        store.signer = Some(ca.clone());
        store.token_signer = Some(Arc::new(jwt::TokenSigner::generate()?));
        if opts.default_namespaces {
            let ns = resources::find("", "v1", "namespaces").expect("namespaces served");
            for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                store
                    .create(ns, "", json!({"metadata": {"name": n}}), &harness_user())
                    .map_err(|e| anyhow!("{e}"))?;
            }
        }
        let tokens = opts
            .bootstrap_tokens
            .iter()
            .map(|t| {
                let id = t.split('.').next().unwrap_or(t);
                (
                    t.clone(),
                    UserInfo::new(
                        &format!("system:bootstrap:{id}"),
                        &[
                            "system:bootstrappers",
                            authz::rbac::KUBEADM_BOOTSTRAP_GROUP,
                            "system:authenticated",
                        ],
                    ),
                )
            })
            .collect();
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            ca,
            tokens: Mutex::new(tokens),
            bookmark_interval: opts.bookmark_interval,
            default_watch_timeout: opts.default_watch_timeout,
            git_version: opts.git_version.clone(),
            grants: Default::default(),
            rbac: Default::default(),
        });
        let listener = server::bind(SocketAddr::from(([127, 0, 0, 1], opts.port))).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(server::serve(listener, acceptor.clone(), shared.clone()));
        Ok(Self {
            shared,
            addr,
            acceptor,
            task: Mutex::new(Some(task)),
        })
    }

    // -- addresses and credentials -----------------------------------------

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The cluster CA certificate (PEM), i.e. kubeadm's `/etc/kubernetes/pki/ca.crt`.
    pub fn ca_pem(&self) -> String {
        self.shared.ca.cert_pem().to_string()
    }

    /// Write the CA certificate to `path`.
    pub fn write_ca(&self, path: impl AsRef<Path>) -> Result<()> {
        std::fs::write(path.as_ref(), self.ca_pem())
            .with_context(|| format!("writing {}", path.as_ref().display()))
    }

    /// A client certificate signed by the cluster CA (user = `cn`, groups = `groups`).
    pub fn issue_client_cert(
        &self,
        cn: &str,
        groups: &[&str],
        lifetime: Duration,
    ) -> Result<IssuedCert> {
        self.shared.ca.client_cert(cn, groups, lifetime)
    }

    /// A client certificate valid between two instants (e.g. already expired).
    pub fn issue_client_cert_between(
        &self,
        cn: &str,
        groups: &[&str],
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Result<IssuedCert> {
        self.shared
            .ca
            .client_cert_between(cn, groups, not_before, not_after)
    }

    // -- lifecycle -----------------------------------------------------------

    /// Stop serving: close the listener and every open connection (watches end
    /// abruptly). Data is kept.
    pub async fn stop(&self) {
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
        self.shared.store().close_watches(None);
    }

    /// Serve again on the same address with the same data and CA.
    pub async fn resume(&self) -> Result<()> {
        if self.is_serving() {
            return Ok(());
        }
        let listener = server::bind(self.addr).await?;
        let task = tokio::spawn(server::serve(
            listener,
            self.acceptor.clone(),
            self.shared.clone(),
        ));
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(())
    }

    /// An apiserver outage: [`stop`](Self::stop), wait `outage`, [`resume`](Self::resume).
    pub async fn restart(&self, outage: Duration) -> Result<()> {
        self.stop().await;
        tokio::time::sleep(outage).await;
        self.resume().await
    }

    pub fn is_serving(&self) -> bool {
        self.task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    // -- direct store access (no HTTP, acting as system:masters) -------------

    /// Create an object of `resource` (`pods`, `nodes`, `leases.coordination.k8s.io`,
    /// `events.events.k8s.io`, ...). The namespace comes from the object (default `default`).
    pub fn create(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        let res = resolve(resource)?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.shared.store().create(res, &ns, obj, &harness_user())
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let res = resolve(resource).ok()?;
        self.shared.store().get(res, namespace, name).ok()
    }

    /// All objects of `resource` (every namespace when `namespace` is None).
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let Ok(res) = resolve(resource) else {
            return Vec::new();
        };
        self.shared
            .store()
            .select(res, namespace, &Default::default(), &Default::default())
    }

    /// PUT semantics (a `metadata.resourceVersion` in `obj` is a precondition).
    pub fn update(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        self.write(resource, obj, Subresource::Main)
    }

    /// PUT on `/status`.
    pub fn update_status(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        self.write(resource, obj, Subresource::Status)
    }

    fn write(&self, resource: &str, obj: Value, sub: Subresource) -> Result<Value, ApiError> {
        let res = resolve(resource)?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.shared
            .store()
            .update(res, &ns, &name, obj, sub, false, &harness_user())
    }

    /// PATCH with a content type (`application/merge-patch+json`, ...).
    pub fn patch(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        content_type: &str,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let res = resolve(resource)?;
        self.shared.store().patch(
            res,
            namespace,
            name,
            content_type,
            patch,
            Subresource::Main,
            &harness_user(),
        )
    }

    /// PATCH `pods/<name>/resize` (the in-place resize subresource).
    pub fn patch_resize(
        &self,
        namespace: &str,
        name: &str,
        content_type: &str,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let res = resolve("pods")?;
        self.shared.store().patch(
            res,
            namespace,
            name,
            content_type,
            patch,
            Subresource::Resize,
            &harness_user(),
        )
    }

    /// PATCH `/status`.
    pub fn patch_status(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        content_type: &str,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let res = resolve(resource)?;
        self.shared.store().patch(
            res,
            namespace,
            name,
            content_type,
            patch,
            Subresource::Status,
            &harness_user(),
        )
    }

    /// DELETE with upstream semantics (`grace` None = the object's default). For
    /// pods a positive grace only marks the pod terminating. Returns the object
    /// and whether it is gone.
    pub fn delete(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        grace: Option<i64>,
    ) -> Result<(Value, bool), ApiError> {
        let res = resolve(resource)?;
        self.shared.store().delete(
            res,
            namespace,
            name,
            &DeleteOpts {
                grace_period_seconds: grace,
                ..Default::default()
            },
        )
    }

    /// Remove an object immediately, whatever its kind, finalizers or grace.
    pub fn remove(&self, resource: &str, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let res = resolve(resource)?;
        let mut st = self.shared.store();
        let mut obj = st.get(res, namespace, name)?;
        if obj.pointer("/metadata/finalizers").is_some() {
            obj["metadata"]["finalizers"] = json!([]);
            obj = st.update(
                res,
                namespace,
                name,
                obj,
                Subresource::Main,
                false,
                &harness_user(),
            )?;
            if st.get(res, namespace, name).is_err() {
                return Ok(obj);
            }
        }
        st.delete(
            res,
            namespace,
            name,
            &DeleteOpts {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .map(|(o, _)| o)
    }

    /// Typed create (`K` picks the resource).
    pub fn create_typed<K>(&self, obj: &K) -> Result<K, ApiError>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let res = resolve_typed::<K>()?;
        let v = serde_json::to_value(obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        to_typed(self.shared.store().create(res, &ns, v, &harness_user())?)
    }

    /// Typed get.
    pub fn get_typed<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let res = resolve_typed::<K>().ok()?;
        let v = self.shared.store().get(res, namespace, name).ok()?;
        to_typed(v).ok()
    }

    /// Typed update (PUT semantics).
    pub fn update_typed<K>(&self, obj: &K) -> Result<K, ApiError>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let res = resolve_typed::<K>()?;
        let v = serde_json::to_value(obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        to_typed(self.shared.store().update(
            res,
            &ns,
            &name,
            v,
            Subresource::Main,
            false,
            &harness_user(),
        )?)
    }

    /// Typed list of every object of `K` (in `namespace` when given).
    pub fn list_typed<K>(&self, namespace: Option<&str>) -> Vec<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let Ok(res) = resolve_typed::<K>() else {
            return Vec::new();
        };
        self.shared
            .store()
            .select(res, namespace, &Default::default(), &Default::default())
            .into_iter()
            .filter_map(|v| to_typed(v).ok())
            .collect()
    }

    /// Approve a CSR by hand (as `kubectl certificate approve` does); the signer then signs it.
    pub fn approve_csr(&self, name: &str) -> Result<Value, ApiError> {
        self.csr_condition(name, "Approved", "ApprovedByTest")
    }

    /// Deny a CSR by hand.
    pub fn deny_csr(&self, name: &str) -> Result<Value, ApiError> {
        self.csr_condition(name, "Denied", "DeniedByTest")
    }

    fn csr_condition(&self, name: &str, ty: &str, reason: &str) -> Result<Value, ApiError> {
        let res = resolve("certificatesigningrequests.certificates.k8s.io")?;
        let mut st = self.shared.store();
        let mut csr = st.get(res, "", name)?;
        let mut conds = csr
            .pointer("/status/conditions")
            .cloned()
            .unwrap_or(json!([]));
        if let Some(a) = conds.as_array_mut() {
            a.push(json!({"type": ty, "status": "True", "reason": reason, "message": "set by the test"}));
        }
        csr["status"] = json!({"conditions": conds});
        st.update(
            res,
            "",
            name,
            csr,
            Subresource::Approval,
            false,
            &harness_user(),
        )
    }

    /// Poll until `pred` holds for the object (or its absence: `None`), up to `timeout`.
    pub async fn wait_for<F>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        timeout: Duration,
        mut pred: F,
    ) -> Option<Value>
    where
        F: FnMut(Option<&Value>) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let cur = self.get(resource, namespace, name);
            if pred(cur.as_ref()) {
                return cur.or(Some(Value::Null));
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version()
    }

    /// Every stored object (debug dumps).
    pub fn dump(&self) -> Vec<Value> {
        self.shared.store().dump()
    }

    // -- fault injection -----------------------------------------------------

    /// The next `count` requests whose path starts with `path_prefix` answer
    /// `code` (500, 503, 429 with Retry-After: 1, 504, ...) with a Status body.
    pub fn fail_next(&self, path_prefix: &str, count: usize, code: u16) {
        self.fail_next_method(None, path_prefix, count, code);
    }

    /// Like [`fail_next`](Self::fail_next) for one HTTP method only (`"PATCH"`, ...).
    pub fn fail_next_method(
        &self,
        method: Option<&str>,
        path_prefix: &str,
        count: usize,
        code: u16,
    ) {
        self.shared.store().faults.push(store::Fault {
            method: method.map(str::to_string),
            path_prefix: path_prefix.to_string(),
            remaining: count,
            code,
        });
    }

    /// Drop all pending injected failures.
    pub fn clear_faults(&self) {
        self.shared.store().faults.clear();
    }

    /// Send a malformed event into every open watch of `resource` (all resources
    /// when None): valid JSON whose object has the wrong shape (`metadata.name` is a
    /// number), so a typed client fails to decode it. Returns how many streams got it.
    /// (A truncated line would be silently skipped by kube's line decoder.)
    pub fn inject_watch_garbage(&self, resource: Option<&str>) -> usize {
        self.inject_watch_line(
            resource,
            r#"{"type":"MODIFIED","object":{"metadata":{"name":7,"resourceVersion":[]}}}"#,
        )
    }

    /// Send an arbitrary line into open watches (e.g. an object of the wrong shape).
    pub fn inject_watch_line(&self, resource: Option<&str>, line: &str) -> usize {
        let res = resource.and_then(resources::by_name);
        self.shared.store().inject_watch_line(res, line)
    }

    /// End open watch streams (cleanly, as on apiserver shutdown). Returns how many.
    pub fn close_watches(&self, resource: Option<&str>) -> usize {
        let res = resource.and_then(resources::by_name);
        self.shared.store().close_watches(res)
    }

    /// Open watch streams of `resource` (all when None).
    pub fn watcher_count(&self, resource: Option<&str>) -> usize {
        let res = resource.and_then(resources::by_name);
        self.shared.store().watcher_count(res)
    }

    /// Forget the event history: resuming any watch from an older resourceVersion
    /// now gets the 410 Expired ERROR event (forces clients to relist).
    pub fn expire_history(&self) {
        self.shared.store().compact();
    }

    // -- service-account tokens ---------------------------------------------

    /// The claims of a service-account token this control plane issued, once its
    /// signature, issuer and expiry check out (upstream's one-minute leeway).
    pub fn verify_service_account_token(&self, token: &str) -> Result<Value> {
        self.shared
            .store()
            .verify_token(token)
            .map_err(|e| anyhow!("{e}"))
    }

    /// Every TokenRequest served so far, in order: (namespace, service account,
    /// bound pod name or "" when not pod-bound).
    pub fn token_requests(&self) -> Vec<(String, String, String)> {
        self.shared
            .store()
            .token_requests
            .iter()
            .map(|r| {
                (
                    r.namespace.clone(),
                    r.service_account.clone(),
                    r.pod.clone(),
                )
            })
            .collect()
    }

    // -- request log ---------------------------------------------------------

    /// Requests served so far (method, path, query, user, status code).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.store().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.shared.store().requests.clear();
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn tls_acceptor(ca: &pki::Authority, serving: &IssuedCert) -> Result<TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes())?)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let chain = vec![
        CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?,
        CertificateDer::from_pem_slice(ca.cert_pem().as_bytes())?,
    ];
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}
