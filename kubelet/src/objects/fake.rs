//! An in-memory [`ApiObjects`]: objects set by the test, watches that see every change,
//! tokens numbered in order of request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

use super::{ApiObjects, ObjectData, ObjectError, ObjectKey};

#[derive(Default)]
pub struct FakeApi {
    objects: Mutex<BTreeMap<ObjectKey, ObjectData>>,
    version: watch::Sender<u64>,
    /// (namespace, service account, request) per TokenRequest served.
    requests: Mutex<Vec<(String, String, TokenRequest)>>,
    refuse: Mutex<Option<String>>,
    clock: Mutex<Option<Arc<AtomicI64>>>,
    /// Direct reads (`get`) served.
    pub gets: AtomicUsize,
    /// Watches started.
    pub follows: AtomicUsize,
}

impl FakeApi {
    pub fn set(&self, key: ObjectKey, data: ObjectData) {
        self.objects.lock().unwrap().insert(key, data);
        self.version.send_modify(|v| *v += 1);
    }

    pub fn delete(&self, key: &ObjectKey) {
        self.objects.lock().unwrap().remove(key);
        self.version.send_modify(|v| *v += 1);
    }

    /// Token requests fail with this message (None: they succeed again).
    pub fn refuse_tokens(&self, message: Option<String>) {
        *self.refuse.lock().unwrap() = message;
    }

    /// Tokens are issued at this clock's time (unix seconds); else the real one.
    pub fn set_clock(&self, clock: Arc<AtomicI64>) {
        *self.clock.lock().unwrap() = Some(clock);
    }

    pub fn token_requests(&self) -> Vec<(String, String, TokenRequest)> {
        self.requests.lock().unwrap().clone()
    }

    fn now(&self) -> i64 {
        match &*self.clock.lock().unwrap() {
            Some(c) => c.load(Ordering::SeqCst),
            None => crate::clock::unix_now(),
        }
    }
}

#[async_trait::async_trait]
impl ApiObjects for FakeApi {
    async fn get(&self, key: &ObjectKey) -> Result<Option<ObjectData>, ObjectError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Ok(self.objects.lock().unwrap().get(key).cloned())
    }

    async fn follow(
        &self,
        key: &ObjectKey,
        on_change: &(dyn Fn(Option<ObjectData>) + Send + Sync),
    ) -> ObjectError {
        self.follows.fetch_add(1, Ordering::SeqCst);
        let mut rx = self.version.subscribe();
        loop {
            rx.borrow_and_update();
            let state = self.objects.lock().unwrap().get(key).cloned();
            on_change(state);
            if rx.changed().await.is_err() {
                return ObjectError::Api("fake apiserver gone".into());
            }
        }
    }

    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, ObjectError> {
        if let Some(m) = self.refuse.lock().unwrap().clone() {
            return Err(ObjectError::Api(m));
        }
        let mut requests = self.requests.lock().unwrap();
        requests.push((
            namespace.to_string(),
            service_account.to_string(),
            request.clone(),
        ));
        let n = requests.len();
        let seconds = request
            .spec
            .as_ref()
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(3600);
        let exp = jiff::Timestamp::from_second(self.now() + seconds)
            .map_err(|e| ObjectError::Api(e.to_string()))?;
        let mut answer = request.clone();
        answer.status = Some(TokenRequestStatus {
            token: Some(format!("token-{n}-{namespace}-{service_account}")),
            expiration_timestamp: Some(Time(exp)),
        });
        Ok(answer)
    }
}
