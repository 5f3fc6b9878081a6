//! Image credential provider plugins (upstream's `pkg/credentialprovider/plugin`): for an
//! image one of a provider's `matchImages` globs matches, the kubelet runs the provider's
//! executable with a `CredentialProviderRequest` on standard input and reads a
//! `CredentialProviderResponse` (registry credentials by location) from its standard output.
//! Answers are cached per image, registry or globally as the plugin's `cacheKeyType` says,
//! for its `cacheDuration` (else the provider's `defaultCacheDuration`; 0: not cached).
//!
//! In the service-account-token mode (`tokenAttributes`) the request also carries a token
//! for the pod's service account (audience `serviceAccountTokenAudience`, bound to the pod)
//! and the account's annotations the provider names; the cache is then per service account
//! (`cacheType: ServiceAccount`) or per token (`Token`), and credentials that came this way
//! are recorded against the service account for pulled-image verification.
//!
//! A plugin never hangs a pull: it is killed after [`EXEC_TIMEOUT`] (upstream's one minute).
//! A plugin that fails, times out or answers malformed JSON gives no credentials (the pull
//! goes on with the others, as upstream); the error names the plugin and the image and never
//! quotes the answer (it may hold credentials).

pub mod accounts;
pub mod config;
pub mod exec;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use plumbing::duration;
use serde::Deserialize;
use tokio::time::Instant;

pub use accounts::ApiServiceAccounts;
pub use config::{ConfigError, ProviderConfig, SourcedProvider};
pub use exec::{ExecError, Invocation, PluginExec, ProcessExec};

use super::{ConfigEntry, DockerConfig, Keyring, hash_auth};
use crate::images::pull_records::format::ImagePullServiceAccount;
use crate::runtime::ImageAuth;

/// A plugin still running after this is killed (upstream's catch-all one minute).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// Expired cache entries are dropped at most this often (upstream's purge interval).
pub const CACHE_PURGE_INTERVAL: Duration = Duration::from_secs(15 * 60);
const GLOBAL_CACHE_KEY: &str = "global";
const REQUEST_KIND: &str = "CredentialProviderRequest";
const RESPONSE_KIND: &str = "CredentialProviderResponse";

/// The pod whose pull asks for credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.serviceAccountName` (empty: none, e.g. static pods).
    pub service_account: String,
}

impl PodIdentity {
    pub fn of(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        let m = &pod.metadata;
        PodIdentity {
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        }
    }
}

/// What the token mode reads of a ServiceAccount.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAccountData {
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
}

/// The apiserver side of the token mode.
#[async_trait::async_trait]
pub trait ServiceAccounts: Send + Sync + 'static {
    /// `serviceaccounts/<name>` in `namespace`.
    async fn get(&self, namespace: &str, name: &str) -> Result<ServiceAccountData, AccountError>;
    /// A token for the account with `audience`, bound to the pod.
    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        service_account_uid: &str,
        audience: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<String, AccountError>;
}

/// Why the token mode got no ServiceAccount or token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountError {
    #[error("serviceaccounts {0:?} not found")]
    NotFound(String),
    #[error("{0}")]
    Api(#[from] crate::objects::ObjectError),
    #[error("the TokenRequest came back without a token")]
    NoToken,
}

/// Why a plugin gave no credentials (logged; the pull goes on without them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    #[error("error execing credential provider plugin {plugin} for image {image}: {source}")]
    Exec {
        plugin: String,
        image: String,
        source: ExecError,
    },
    #[error("credential provider plugin {plugin}: error reading GVK from response: {message}")]
    Gvk { plugin: String, message: String },
    #[error(
        "credential provider plugin {plugin}: apiVersion from credential plugin response did not match expected apiVersion:{expected}, actual apiVersion:{actual}"
    )]
    ApiVersion {
        plugin: String,
        expected: String,
        actual: String,
    },
    /// Never quotes the answer: it may hold credentials.
    #[error(
        "credential provider plugin {plugin}: error decoding credential provider plugin response from stdout"
    )]
    Decode { plugin: String },
    #[error(
        "credential provider plugin {plugin}: failed to decode CredentialProviderResponse, unexpected Kind: {kind:?}"
    )]
    Kind { plugin: String, kind: String },
    #[error(
        "credential provider plugin {plugin} did not return a valid cacheKeyType: {cache_key_type:?}"
    )]
    CacheKeyType {
        plugin: String,
        cache_key_type: String,
    },
    #[error(
        "Credential provider plugin {plugin} returned the service account token as the password for image {image:?}, which is not allowed when service account cache type is not set to 'Token'"
    )]
    EchoedToken { plugin: String, image: String },
    #[error("Failed to get service account {namespace}/{name}: {message}")]
    ServiceAccount {
        namespace: String,
        name: String,
        message: String,
    },
    #[error("Error getting service account token {namespace}/{name}: {message}")]
    Token {
        namespace: String,
        name: String,
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthConfig {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Response {
    #[serde(default)]
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    #[allow(dead_code)]
    api_version: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default, with = "duration::serde_opt")]
    cache_duration: Option<Duration>,
    #[serde(default)]
    auth: BTreeMap<String, AuthConfig>,
}

#[derive(Debug, Clone)]
struct CacheEntry {
    creds: Vec<(String, String, String)>,
    expires_at: Instant,
}

/// A run of a plugin that concurrent requests for the same key share.
type Flight = Shared<BoxFuture<'static, Result<Arc<Vec<u8>>, ExecError>>>;

struct Provider {
    config: ProviderConfig,
    program: PathBuf,
    cache: Mutex<(HashMap<String, CacheEntry>, Instant)>,
    /// Runs in progress by singleflight key (upstream's `singleflight.Group`).
    flights: Mutex<HashMap<String, Flight>>,
}

/// The node's credential provider plugins.
pub struct CredentialProviders {
    providers: Vec<Provider>,
    exec: Arc<dyn PluginExec>,
    accounts: Option<Arc<dyn ServiceAccounts>>,
    timeout: Duration,
}

impl std::fmt::Debug for CredentialProviders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .providers
            .iter()
            .map(|p| p.config.name.as_str())
            .collect();
        f.debug_struct("CredentialProviders")
            .field("providers", &names)
            .finish()
    }
}

/// Upstream's parseRegistry: the image's first path segment.
fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// Length-prefixed fields, so no two field lists give the same key.
fn key_of<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for p in parts {
        out.push_str(&format!("{}:{p};", p.len()));
    }
    out
}

fn sha256_hex(data: &str) -> String {
    use sha2::Digest;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(data.as_bytes()))
    )
}

/// The token-mode part of a request: the token, the annotations and the cache key part.
struct AccountContext {
    token: String,
    annotations: BTreeMap<String, String>,
    cache_key: String,
    coordinates: ImagePullServiceAccount,
}

impl CredentialProviders {
    /// Reads `config` and checks `bin_dir` (see [`config::load`]); the plugins run through
    /// `exec`, the token mode reads service accounts through `accounts` (None: standalone,
    /// no tokens).
    pub async fn load(
        config: &Path,
        bin_dir: &Path,
        exec: Arc<dyn PluginExec>,
        accounts: Option<Arc<dyn ServiceAccounts>>,
    ) -> Result<Self, ConfigError> {
        let (c, b) = (config.to_path_buf(), bin_dir.to_path_buf());
        let providers = tokio::task::spawn_blocking(move || config::load(&c, &b))
            .await
            .map_err(|e| ConfigError::Read {
                path: config.to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            })??;
        Ok(Self::new(providers, bin_dir, exec, accounts))
    }

    /// Providers already read and validated.
    pub fn new(
        providers: Vec<SourcedProvider>,
        bin_dir: &Path,
        exec: Arc<dyn PluginExec>,
        accounts: Option<Arc<dyn ServiceAccounts>>,
    ) -> Self {
        let now = Instant::now();
        CredentialProviders {
            providers: providers
                .into_iter()
                .map(|p| Provider {
                    program: bin_dir.join(&p.config.name),
                    config: p.config,
                    cache: Mutex::new((HashMap::new(), now)),
                    flights: Mutex::new(HashMap::new()),
                })
                .collect(),
            exec,
            accounts,
            timeout: EXEC_TIMEOUT,
        }
    }

    /// A different plugin timeout (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn names(&self) -> Vec<String> {
        self.providers
            .iter()
            .map(|p| p.config.name.clone())
            .collect()
    }

    /// The credentials the plugins give for `repository` (a normalised repository without
    /// tag, as the keyring looks images up) pulled for `pod`: one keyring per provider that
    /// gave any, in the configuration's order. Errors are logged and give nothing.
    pub async fn keyrings(&self, repository: &str, pod: &PodIdentity) -> Vec<Keyring> {
        let mut out = Vec::new();
        for p in &self.providers {
            match self.provide(p, repository, pod).await {
                Ok(Some((creds, account))) if !creds.is_empty() => {
                    let mut k = Keyring::default();
                    k.add(docker_config(&creds));
                    k.service_account = account;
                    out.push(k);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(plugin = %p.config.name, image = %repository, error = %e, "Failed getting credential from external registry credential provider");
                }
            }
        }
        out
    }

    async fn account_context(
        &self,
        p: &Provider,
        pod: &PodIdentity,
    ) -> Result<Option<Option<AccountContext>>, PluginError> {
        let Some(t) = &p.config.token_attributes else {
            return Ok(Some(None));
        };
        if pod.service_account.is_empty() {
            if t.require_service_account.unwrap_or(true) {
                tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), "Service account name is empty for pod");
                return Ok(None);
            }
            return Ok(Some(None));
        }
        let sa_err = |message: String| PluginError::ServiceAccount {
            namespace: pod.namespace.clone(),
            name: pod.service_account.clone(),
            message,
        };
        let Some(accounts) = &self.accounts else {
            return Err(sa_err("no apiserver (standalone)".into()));
        };
        let sa = accounts
            .get(&pod.namespace, &pod.service_account)
            .await
            .map_err(|e| sa_err(e.to_string()))?;
        let mut annotations = BTreeMap::new();
        for k in &t.required_service_account_annotation_keys {
            match sa.annotations.get(k) {
                Some(v) => {
                    annotations.insert(k.clone(), v.clone());
                }
                None => {
                    tracing::debug!(namespace = %pod.namespace, service_account = %pod.service_account, annotation = %k, "required annotation not found: the plugin is not run");
                    return Ok(None);
                }
            }
        }
        for k in &t.optional_service_account_annotation_keys {
            if let Some(v) = sa.annotations.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let token = accounts
            .token(
                &pod.namespace,
                &pod.service_account,
                &sa.uid,
                &t.service_account_token_audience,
                &pod.name,
                &pod.uid,
            )
            .await
            .map_err(|e| PluginError::Token {
                namespace: pod.namespace.clone(),
                name: pod.service_account.clone(),
                message: e.to_string(),
            })?;
        let mut parts: Vec<&str> = vec![&pod.namespace, &pod.service_account, &sa.uid];
        let count = annotations.len().to_string();
        parts.push(&count);
        for (k, v) in &annotations {
            parts.push(k);
            parts.push(v);
        }
        let token_hash = sha256_hex(&token);
        if t.cache_type == "Token" {
            parts.push("token");
            parts.push(&token_hash);
        }
        Ok(Some(Some(AccountContext {
            cache_key: key_of(parts),
            coordinates: ImagePullServiceAccount {
                uid: sa.uid.clone(),
                namespace: pod.namespace.clone(),
                name: pod.service_account.clone(),
            },
            token,
            annotations,
        })))
    }

    /// One provider's credentials for `image`: None when it does not apply.
    #[allow(clippy::type_complexity)]
    async fn provide(
        &self,
        p: &Provider,
        image: &str,
        pod: &PodIdentity,
    ) -> Result<
        Option<(
            Vec<(String, String, String)>,
            Option<ImagePullServiceAccount>,
        )>,
        PluginError,
    > {
        if !p
            .config
            .match_images
            .iter()
            .any(|m| super::urls_match(m, image))
        {
            return Ok(None);
        }
        let Some(account) = self.account_context(p, pod).await? else {
            return Ok(None);
        };
        let sa_key = account
            .as_ref()
            .map(|a| a.cache_key.clone())
            .unwrap_or_default();
        let coordinates = account.as_ref().map(|a| a.coordinates.clone());
        if let Some(creds) = self.cached(p, image, &sa_key) {
            return Ok(Some((creds, coordinates)));
        }
        let response = self.exec(p, image, account.as_ref()).await?;
        if let Some(a) = &account
            && p.config
                .token_attributes
                .as_ref()
                .is_some_and(|t| t.cache_type != "Token")
            && response.auth.values().any(|c| c.password == a.token)
        {
            return Err(PluginError::EchoedToken {
                plugin: p.config.name.clone(),
                image: image.to_string(),
            });
        }
        let base = match response.cache_key_type.as_str() {
            "Image" => image.to_string(),
            "Registry" => registry_of(image).to_string(),
            "Global" => GLOBAL_CACHE_KEY.to_string(),
            other => {
                return Err(PluginError::CacheKeyType {
                    plugin: p.config.name.clone(),
                    cache_key_type: other.to_string(),
                });
            }
        };
        let creds: Vec<(String, String, String)> = response
            .auth
            .into_iter()
            .map(|(loc, a)| (loc, a.username, a.password))
            .collect();
        let ttl = match response.cache_duration {
            Some(d) => d,
            None => p.config.default_cache_duration.unwrap_or_default(),
        };
        if !ttl.is_zero() {
            let mut cache = p.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.0.insert(
                key_of([base.as_str(), sa_key.as_str()]),
                CacheEntry {
                    creds: creds.clone(),
                    expires_at: Instant::now() + ttl,
                },
            );
        }
        Ok(Some((creds, coordinates)))
    }

    /// Cached credentials for the image, its registry, or global, in that order.
    fn cached(
        &self,
        p: &Provider,
        image: &str,
        sa_key: &str,
    ) -> Option<Vec<(String, String, String)>> {
        let now = Instant::now();
        let mut cache = p.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, last_purge) = &mut *cache;
        if now > *last_purge + CACHE_PURGE_INTERVAL {
            entries.retain(|_, e| now <= e.expires_at);
            *last_purge = now;
        }
        for base in [image, registry_of(image), GLOBAL_CACHE_KEY] {
            let key = key_of([base, sa_key]);
            match entries.get(&key) {
                Some(e) if now <= e.expires_at => return Some(e.creds.clone()),
                Some(_) => {
                    entries.remove(&key);
                }
                None => {}
            }
        }
        None
    }

    async fn exec(
        &self,
        p: &Provider,
        image: &str,
        account: Option<&AccountContext>,
    ) -> Result<Response, PluginError> {
        let name = &p.config.name;
        let mut request = serde_json::json!({
            "kind": REQUEST_KIND,
            "apiVersion": p.config.api_version,
            "image": image,
        });
        if let Some(a) = account {
            if !a.token.is_empty() {
                request["serviceAccountToken"] = a.token.clone().into();
            }
            if !a.annotations.is_empty() {
                request["serviceAccountAnnotations"] = serde_json::json!(a.annotations);
            }
        }
        let mut stdin = serde_json::to_vec(&request).unwrap_or_default();
        stdin.push(b'\n');
        let invocation = Invocation {
            program: p.program.clone(),
            args: p.config.args.clone(),
            env: p
                .config
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
            stdin,
            timeout: self.timeout,
        };
        let out = self
            .run_once(p, flight_key(image, account), invocation, image)
            .await
            .map_err(|source| PluginError::Exec {
                plugin: name.clone(),
                image: image.to_string(),
                source,
            })?;
        let meta: TypeMeta = serde_json::from_slice(&out).map_err(|e| PluginError::Gvk {
            plugin: name.clone(),
            // Syntax errors only name a position, never the text.
            message: format!(
                "json parse error at line {} column {}",
                e.line(),
                e.column()
            ),
        })?;
        if meta.api_version != p.config.api_version {
            return Err(PluginError::ApiVersion {
                plugin: name.clone(),
                expected: p.config.api_version.clone(),
                actual: meta.api_version,
            });
        }
        if meta.kind != RESPONSE_KIND {
            return Err(PluginError::Kind {
                plugin: name.clone(),
                kind: meta.kind,
            });
        }
        serde_json::from_slice(&out).map_err(|_| PluginError::Decode {
            plugin: name.clone(),
        })
    }

    /// Runs the plugin, or joins the run already in progress for `key`: concurrent pulls of
    /// one image run the plugin once and share its answer (upstream's singleflight, which
    /// also shares failures). Every run is timed in `kubelet_credential_provider_plugin_*`.
    async fn run_once(
        &self,
        p: &Provider,
        key: String,
        invocation: Invocation,
        image: &str,
    ) -> Result<Arc<Vec<u8>>, ExecError> {
        let flight = {
            let mut flights = p.flights.lock().unwrap_or_else(|e| e.into_inner());
            flights
                .entry(key.clone())
                .or_insert_with(|| {
                    let exec = self.exec.clone();
                    let plugin = p.config.name.clone();
                    tracing::debug!(%plugin, %image, "Getting image credentials from external exec plugin");
                    async move {
                        let start = std::time::Instant::now();
                        let out = exec.run(invocation).await;
                        crate::metrics::credential_plugins().observe_run(
                            &plugin,
                            start.elapsed(),
                            out.is_ok(),
                        );
                        out.map(Arc::new)
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        let out = flight.clone().await;
        let mut flights = p.flights.lock().unwrap_or_else(|e| e.into_inner());
        if flights.get(&key).is_some_and(|f| f.ptr_eq(&flight)) {
            flights.remove(&key);
        }
        out
    }
}

/// Upstream's singleflight key: the image, and in the token mode also the token's hash and
/// the annotations sent, so pulls for different service accounts never share an answer.
fn flight_key(image: &str, account: Option<&AccountContext>) -> String {
    match account {
        Some(a) if !a.token.is_empty() || !a.annotations.is_empty() => {
            let annotations = serde_json::to_string(&a.annotations).unwrap_or_default();
            let token = if a.token.is_empty() {
                String::new()
            } else {
                sha256_hex(&a.token)
            };
            key_of([image, token.as_str(), annotations.as_str()])
        }
        _ => image.to_string(),
    }
}

fn docker_config(creds: &[(String, String, String)]) -> DockerConfig {
    creds
        .iter()
        .map(|(location, username, password)| ConfigEntry {
            location: location.clone(),
            hash: hash_auth(username, password, ""),
            auth: ImageAuth {
                username: username.clone(),
                password: password.clone(),
                location: location.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests;
