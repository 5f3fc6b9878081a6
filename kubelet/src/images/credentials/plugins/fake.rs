//! Fakes of the plugin edges: a plugin that answers from a script, and service accounts
//! from a map.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use super::exec::{ExecError, Invocation, PluginExec};
use super::{AccountError, ServiceAccountData, ServiceAccounts};

/// What a fake plugin run does.
#[derive(Debug, Clone)]
pub enum FakeRun {
    /// Writes this on standard output and exits 0.
    Answer(Vec<u8>),
    /// Fails with this error.
    Fail(ExecError),
    /// Never finishes (the caller's timeout must end it): sleeps this long.
    Hang(std::time::Duration),
    /// Answers this after sleeping this long (a slow plugin).
    Slow(std::time::Duration, Vec<u8>),
}

/// Records each invocation; answers from the queue, then with `default`.
#[derive(Debug)]
pub struct FakeExec {
    pub calls: Mutex<Vec<Invocation>>,
    queue: Mutex<VecDeque<FakeRun>>,
    default: FakeRun,
}

impl FakeExec {
    pub fn answering(default: FakeRun) -> Self {
        FakeExec {
            calls: Mutex::new(Vec::new()),
            queue: Mutex::new(VecDeque::new()),
            default,
        }
    }

    pub fn push(&self, run: FakeRun) {
        self.queue.lock().unwrap().push_back(run);
    }

    pub fn calls(&self) -> Vec<Invocation> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl PluginExec for FakeExec {
    async fn run(&self, inv: Invocation) -> Result<Vec<u8>, ExecError> {
        let timeout = inv.timeout;
        self.calls.lock().unwrap().push(inv);
        let run = self
            .queue
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| self.default.clone());
        match run {
            FakeRun::Answer(b) => Ok(b),
            FakeRun::Slow(d, b) => {
                tokio::time::sleep(d).await;
                Ok(b)
            }
            FakeRun::Fail(e) => Err(e),
            FakeRun::Hang(d) => {
                // The real runner's timeout, as the real runner enforces it.
                match tokio::time::timeout(timeout, tokio::time::sleep(d)).await {
                    Ok(()) => Ok(Vec::new()),
                    Err(_) => Err(ExecError {
                        cause: "context deadline exceeded".into(),
                        stderr: String::new(),
                    }),
                }
            }
        }
    }
}

/// Service accounts by `namespace/name`; tokens are `token-<n>` for the n-th request.
#[derive(Debug, Default)]
pub struct FakeAccounts {
    pub accounts: Mutex<BTreeMap<String, ServiceAccountData>>,
    /// `(namespace, service account, uid, audience, pod name, pod uid)` of each request.
    pub token_requests: Mutex<Vec<[String; 6]>>,
}

#[async_trait::async_trait]
impl ServiceAccounts for FakeAccounts {
    async fn get(&self, namespace: &str, name: &str) -> Result<ServiceAccountData, AccountError> {
        self.accounts
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .ok_or_else(|| AccountError::NotFound(name.to_string()))
    }

    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        service_account_uid: &str,
        audience: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<String, AccountError> {
        let mut r = self.token_requests.lock().unwrap();
        r.push([
            namespace.into(),
            service_account.into(),
            service_account_uid.into(),
            audience.into(),
            pod_name.into(),
            pod_uid.into(),
        ]);
        Ok(format!("token-{}", r.len()))
    }
}
