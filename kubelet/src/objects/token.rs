//! ServiceAccount tokens for projected volumes (upstream's `pkg/kubelet/token`): one
//! TokenRequest per (service account, audiences, lifetime, pod), kept until it needs a
//! refresh: past 80 % of its lifetime (less a few seconds of jitter) or 24 hours after it was
//! issued, whichever comes first. A failed refresh keeps serving the old token while it is
//! still valid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{ApiObjects, ObjectError};

/// A token is refreshed at most this long after it was issued.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Up to this much earlier than 80 % of its lifetime (spreads refreshes of many pods).
pub const MAX_JITTER: Duration = Duration::from_secs(10);

/// What a projected `serviceAccountToken` source asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    pub namespace: String,
    pub service_account: String,
    /// Empty: the apiserver's own audiences.
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    pub pod_name: String,
    pub pod_uid: String,
}

#[derive(Debug, Clone)]
struct Issued {
    token: String,
    /// Unix seconds.
    issued_at: i64,
    expires_at: i64,
    /// Seconds before `issued_at + 80 % of the lifetime` this one refreshes.
    jitter: i64,
}

impl Issued {
    fn needs_refresh(&self, now: i64) -> bool {
        let ttl = self.expires_at - self.issued_at;
        now >= self.expires_at
            || now >= self.issued_at + MAX_TTL.as_secs() as i64
            || now >= self.issued_at + ttl * 8 / 10 - self.jitter
    }
}

/// Requests and caches tokens.
pub struct TokenManager {
    api: Option<Arc<dyn ApiObjects>>,
    cache: Mutex<HashMap<TokenKey, Issued>>,
    now: Box<dyn Fn() -> i64 + Send + Sync>,
}

impl std::fmt::Debug for TokenManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenManager").finish_non_exhaustive()
    }
}

/// A token request that failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("failed to fetch token: {0}")]
pub struct TokenError(pub String);

impl TokenManager {
    pub fn new(api: Option<Arc<dyn ApiObjects>>) -> Self {
        Self::with_clock(api, Box::new(crate::clock::unix_now))
    }

    /// With a clock in unix seconds (tests).
    pub fn with_clock(
        api: Option<Arc<dyn ApiObjects>>,
        now: Box<dyn Fn() -> i64 + Send + Sync>,
    ) -> Self {
        TokenManager {
            api,
            cache: Mutex::new(HashMap::new()),
            now,
        }
    }

    /// A valid token for `key`: the cached one, or a new one when it needs a refresh.
    pub async fn get(&self, key: &TokenKey) -> Result<String, TokenError> {
        let now = (self.now)();
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned();
        if let Some(c) = &cached
            && !c.needs_refresh(now)
        {
            return Ok(c.token.clone());
        }
        match self.request(key, now).await {
            Ok(issued) => {
                let token = issued.token.clone();
                self.cache
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), issued);
                Ok(token)
            }
            Err(e) => match cached {
                // Upstream: a refresh that fails keeps the old token while it is valid.
                Some(c) if now < c.expires_at => {
                    tracing::warn!(namespace = %key.namespace, service_account = %key.service_account, pod = %key.pod_name, error = %e, "token refresh failed; the current token stays until it expires");
                    Ok(c.token)
                }
                _ => Err(e),
            },
        }
    }

    async fn request(&self, key: &TokenKey, now: i64) -> Result<Issued, TokenError> {
        tracing::debug!(namespace = %key.namespace, pod = %key.pod_name, pod_uid = %key.pod_uid, service_account = %key.service_account, "requesting a ServiceAccount token");
        let api = self.api.as_ref().ok_or_else(|| {
            TokenError("the kubelet has no apiserver connection (standalone mode)".into())
        })?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(key.audiences.clone()),
                expiration_seconds: Some(key.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(key.pod_name.clone()),
                    uid: Some(key.pod_uid.clone()),
                }),
            }),
            ..Default::default()
        };
        let answer = api
            .request_token(&key.namespace, &key.service_account, &request)
            .await
            .map_err(|e: ObjectError| TokenError(e.to_string()))?;
        let status = answer
            .status
            .ok_or_else(|| TokenError("the apiserver returned no token".into()))?;
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| TokenError("the apiserver returned an empty token".into()))?;
        let Some(Time(exp)) = status.expiration_timestamp else {
            return Err(TokenError(
                "the apiserver returned a token without an expiration".into(),
            ));
        };
        let expires_at = exp.as_second();
        // Upstream takes the issue time as expiry less the lifetime the spec asked for.
        let lifetime = answer
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(key.expiration_seconds);
        let issued_at = (expires_at - lifetime).min(now);
        Ok(Issued {
            token,
            issued_at,
            expires_at,
            jitter: jitter_for(key),
        })
    }

    /// Forgets the tokens of a pod that is gone.
    pub fn forget_pod(&self, pod_uid: &str) {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| k.pod_uid != pod_uid);
    }

    /// How many tokens are cached.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A stable per-key jitter in `[0, MAX_JITTER)` seconds (no RNG needed: keys differ by pod).
fn jitter_for(key: &TokenKey) -> i64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % MAX_JITTER.as_secs()) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::fake::FakeApi;
    use std::sync::atomic::{AtomicI64, Ordering};

    fn key() -> TokenKey {
        TokenKey {
            namespace: "ns".into(),
            service_account: "default".into(),
            audiences: vec![],
            expiration_seconds: 3607,
            pod_name: "p".into(),
            pod_uid: "u1".into(),
        }
    }

    fn manager(api: Arc<FakeApi>, clock: Arc<AtomicI64>) -> TokenManager {
        TokenManager::with_clock(Some(api), Box::new(move || clock.load(Ordering::SeqCst)))
    }

    #[tokio::test]
    async fn one_request_until_eighty_percent_of_the_lifetime() {
        let api = Arc::new(FakeApi::default());
        let clock = Arc::new(AtomicI64::new(1_000_000));
        api.set_clock(clock.clone());
        let m = manager(api.clone(), clock.clone());
        let t1 = m.get(&key()).await.unwrap();
        for step in [60, 600, 2000, 2870 - 10 - 1] {
            clock.store(1_000_000 + step, Ordering::SeqCst);
            // Jitter is below 10 s: until 80 % less 10 s, never a new request.
            assert_eq!(m.get(&key()).await.unwrap(), t1, "at +{step}s");
        }
        assert_eq!(api.token_requests().len(), 1);
        clock.store(1_000_000 + 3607 * 8 / 10 + 1, Ordering::SeqCst);
        let t2 = m.get(&key()).await.unwrap();
        assert_ne!(t1, t2);
        assert_eq!(api.token_requests().len(), 2);
        let req = &api.token_requests()[0];
        assert_eq!(req.1, "default");
        let spec = req.2.spec.clone().unwrap();
        let bound = spec.bound_object_ref.clone().unwrap();
        assert_eq!(
            (
                bound.kind.as_deref(),
                bound.name.as_deref(),
                bound.uid.as_deref()
            ),
            (Some("Pod"), Some("p"), Some("u1"))
        );
        assert_eq!(spec.expiration_seconds, Some(3607));
    }

    #[tokio::test]
    async fn long_tokens_refresh_after_a_day() {
        let api = Arc::new(FakeApi::default());
        let clock = Arc::new(AtomicI64::new(1_000_000));
        api.set_clock(clock.clone());
        let m = manager(api.clone(), clock.clone());
        let k = TokenKey {
            expiration_seconds: 7 * 24 * 3600,
            ..key()
        };
        m.get(&k).await.unwrap();
        clock.store(1_000_000 + 24 * 3600 - 20, Ordering::SeqCst);
        m.get(&k).await.unwrap();
        assert_eq!(api.token_requests().len(), 1);
        clock.store(1_000_000 + 24 * 3600, Ordering::SeqCst);
        m.get(&k).await.unwrap();
        assert_eq!(api.token_requests().len(), 2);
    }

    #[tokio::test]
    async fn failed_refresh_keeps_the_valid_token_and_fails_once_expired() {
        let api = Arc::new(FakeApi::default());
        let clock = Arc::new(AtomicI64::new(1_000_000));
        api.set_clock(clock.clone());
        let m = manager(api.clone(), clock.clone());
        let t1 = m.get(&key()).await.unwrap();
        api.refuse_tokens(Some("serviceaccounts \"default\" is forbidden".into()));
        clock.store(1_000_000 + 3000, Ordering::SeqCst);
        assert_eq!(m.get(&key()).await.unwrap(), t1);
        clock.store(1_000_000 + 3607, Ordering::SeqCst);
        let e = m.get(&key()).await.unwrap_err();
        assert!(e.0.contains("forbidden"), "{e}");
    }

    #[tokio::test]
    async fn standalone_has_no_tokens() {
        let m = TokenManager::new(None);
        let e = m.get(&key()).await.unwrap_err();
        assert!(e.0.contains("standalone"), "{e}");
    }
}
