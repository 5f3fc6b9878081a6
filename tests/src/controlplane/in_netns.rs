//! [`NetnsControlPlane`]: the test control plane served from inside a network namespace.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Options, TestControlPlane};
use crate::netns::enter_netns;
use crate::rig::Rig;

/// A [`TestControlPlane`] listening on 127.0.0.1 *inside* a rig's network namespace, so the
/// agent (which runs there) reaches it, while the test reads and writes its store directly
/// in-process.
///
/// How: a throwaway thread enters the netns with setns(2) and builds a multi-threaded tokio
/// runtime; the runtime's worker threads are created by that thread and so live in the netns
/// too. Anything that binds a listener (start, resume) runs as a task on those workers.
pub struct NetnsControlPlane {
    pub cp: Arc<TestControlPlane>,
    rt: Option<tokio::runtime::Runtime>,
}

impl NetnsControlPlane {
    pub fn start(rig: &Rig, opts: Options) -> NetnsControlPlane {
        Self::start_in(rig.netns_path(), opts)
    }

    /// Starts it inside the network namespace at `netns_path` (`/run/netns/NAME`).
    pub fn start_in(netns_path: &str, opts: Options) -> NetnsControlPlane {
        let netns = netns_path.to_string();
        let rt = std::thread::spawn(move || {
            enter_netns(&netns);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime")
        })
        .join()
        .expect("netns thread");
        let cp = rt
            .block_on(async {
                tokio::spawn(TestControlPlane::start(opts))
                    .await
                    .expect("start task")
            })
            .expect("start control plane");
        NetnsControlPlane {
            cp: Arc::new(cp),
            rt: Some(rt),
        }
    }

    /// Runs `f(cp)` as a task on the netns runtime and waits for it.
    pub fn run<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(Arc<TestControlPlane>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let rt = self.rt.as_ref().unwrap();
        let fut = f(self.cp.clone());
        rt.block_on(async { tokio::spawn(fut).await.expect("task") })
    }

    /// Stops serving (an outage); data is kept.
    pub fn stop(&self) {
        self.run(|cp| async move { cp.stop().await })
    }

    /// Serves again on the same address (inside the netns).
    pub fn resume(&self) {
        self.run(|cp| async move { cp.resume().await })
            .expect("resume control plane")
    }
}

impl std::ops::Deref for NetnsControlPlane {
    type Target = TestControlPlane;
    fn deref(&self) -> &Self::Target {
        &self.cp
    }
}

impl Drop for NetnsControlPlane {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}
