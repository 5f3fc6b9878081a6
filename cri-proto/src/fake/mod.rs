//! A fake CRI runtime served over a real unix socket with tonic, for tests of CRI clients
//! through the wire (`--features test-util`).
//!
//! [`FakeCri::start`] serves `RuntimeService` and `ImageService` on `cri.sock` in a temporary
//! directory. It
//! - **records** every request it receives, in order, with the deadline the client sent
//!   (`grpc-timeout`): [`FakeCri::calls`], [`FakeCri::requests`];
//! - **injects** an error (a gRPC status) and/or a delay per method, for every call or the
//!   next `n`: [`FakeCri::fail`], [`FakeCri::fail_times`], [`FakeCri::delay`];
//! - keeps **minimal state** (sandboxes, containers, images; [`State`]) so that what one call
//!   created the next lists, with the CRI's filters and containerd's answers for unknown ids
//!   (status of one: `NOT_FOUND`; stop or remove of one: success).
//!
//! Methods are named as in the proto (`"RunPodSandbox"`). A method the kubelet does not call
//! answers `UNIMPLEMENTED` and is not recorded.

mod image;
mod runtime;
mod state;

pub use state::{FakeContainer, FakeSandbox, State};

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tonic::{Code, Status};

/// One request the fake received.
#[derive(Clone)]
pub struct Call {
    /// The proto method name, e.g. `"RunPodSandbox"`.
    pub method: &'static str,
    /// The deadline the client sent (`grpc-timeout`), if any.
    pub timeout: Option<Duration>,
    message: Arc<dyn Any + Send + Sync>,
}

impl Call {
    /// The request message, if it is a `T`.
    pub fn message<T: 'static>(&self) -> Option<&T> {
        self.message.downcast_ref()
    }
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("method", &self.method)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What a method does before (or instead of) answering.
#[derive(Debug, Clone, Default)]
struct Fault {
    error: Option<(Code, String)>,
    delay: Option<Duration>,
    /// Calls left to affect (`None`: every call until cleared).
    times: Option<usize>,
}

#[derive(Default)]
struct Shared {
    calls: Mutex<Vec<Call>>,
    faults: Mutex<HashMap<String, Fault>>,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `grpc-timeout` (`<digits><unit>`, units H M S m u n) as a duration.
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The services' shared handle: records, applies faults, holds the state.
#[derive(Clone)]
struct Svc(Arc<Shared>);

impl Svc {
    /// Records the request, waits out the method's delay, fails with its error if it has one;
    /// otherwise hands the message to the method.
    async fn enter<T: Clone + Send + Sync + 'static>(
        &self,
        method: &'static str,
        req: tonic::Request<T>,
    ) -> Result<T, Status> {
        let timeout = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        let msg = req.into_inner();
        lock(&self.0.calls).push(Call {
            method,
            timeout,
            message: Arc::new(msg.clone()),
        });
        let fault = {
            let mut faults = lock(&self.0.faults);
            let fault = faults.get_mut(method).map(|f| {
                if let Some(n) = f.times.as_mut() {
                    *n = n.saturating_sub(1);
                }
                f.clone()
            });
            if faults.get(method).is_some_and(|f| f.times == Some(0)) {
                faults.remove(method);
            }
            fault
        };
        if let Some(f) = fault {
            if let Some(d) = f.delay {
                tokio::time::sleep(d).await;
            }
            if let Some((code, message)) = f.error {
                return Err(Status::new(code, message));
            }
        }
        Ok(msg)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.0.state)
    }
}

/// A running fake runtime; the server stops and the socket's directory goes on drop.
pub struct FakeCri {
    shared: Arc<Shared>,
    path: PathBuf,
    endpoint: String,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for FakeCri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCri")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl FakeCri {
    /// Serves both services on a fresh socket (on the current tokio runtime).
    pub async fn start() -> std::io::Result<FakeCri> {
        let dir = tempfile::Builder::new().prefix("fake-cri").tempdir()?;
        let path = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&path)?;
        let shared = Arc::new(Shared::default());
        let svc = Svc(shared.clone());
        let server = tokio::spawn(async move {
            let incoming = crate::uds::incoming(listener);
            let served = tonic::transport::Server::builder()
                .add_service(crate::runtime_server(svc.clone()))
                .add_service(crate::image_server(svc))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "fake CRI server stopped");
            }
        });
        Ok(FakeCri {
            shared,
            endpoint: format!("unix://{}", path.display()),
            path,
            server,
            _dir: dir,
        })
    }

    /// `unix:///…/cri.sock`, as `--container-runtime-endpoint` takes it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.path
    }

    /// Every request received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared.calls).clone()
    }

    /// The method names of [`FakeCri::calls`], in order.
    pub fn methods(&self) -> Vec<&'static str> {
        lock(&self.shared.calls).iter().map(|c| c.method).collect()
    }

    /// How many requests `method` received.
    pub fn count(&self, method: &str) -> usize {
        lock(&self.shared.calls)
            .iter()
            .filter(|c| c.method == method)
            .count()
    }

    /// The request messages `method` received, in order.
    pub fn requests<T: Clone + 'static>(&self, method: &str) -> Vec<T> {
        lock(&self.shared.calls)
            .iter()
            .filter(|c| c.method == method)
            .filter_map(|c| c.message::<T>().cloned())
            .collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_calls(&self) {
        lock(&self.shared.calls).clear();
    }

    fn set_fault(&self, method: &str, edit: impl FnOnce(&mut Fault)) {
        let mut faults = lock(&self.shared.faults);
        edit(faults.entry(method.to_string()).or_default());
    }

    /// Every call of `method` fails with `code` and `message` until [`FakeCri::clear`].
    pub fn fail(&self, method: &str, code: Code, message: &str) {
        self.set_fault(method, |f| {
            f.error = Some((code, message.to_string()));
            f.times = None;
        });
    }

    /// The next `n` calls of `method` fail with `code` and `message`.
    pub fn fail_times(&self, method: &str, n: usize, code: Code, message: &str) {
        self.set_fault(method, |f| {
            f.error = Some((code, message.to_string()));
            f.times = Some(n);
        });
    }

    /// Every call of `method` waits `delay` before answering, until [`FakeCri::clear`].
    pub fn delay(&self, method: &str, delay: Duration) {
        self.set_fault(method, |f| f.delay = Some(delay));
    }

    /// `method` answers normally again.
    pub fn clear(&self, method: &str) {
        lock(&self.shared.faults).remove(method);
    }

    /// Reads or changes the runtime's state (sandboxes, containers, images, answers).
    pub fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut lock(&self.shared.state))
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[cfg(test)]
mod tests;
