//! The sync loop: the one place desired pods meet workers. Pod sources send full sets, the
//! PLEG says which pods changed in the runtime; the loop starts a worker per new UID, forwards
//! spec changes, asks removed pods to terminate, and stops pods the runtime has that no source
//! wants (once every source has reported at least once).

use crate::pleg::Relist;
use crate::pod::ANN_CONFIG_SEEN;
use crate::worker::{Env, Msg, Worker};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

struct Handle {
    tx: mpsc::UnboundedSender<Msg>,
    pod: Pod,
    terminating: bool,
}

/// Routes desired state and runtime events to per-pod workers.
pub struct SyncLoop {
    env: Arc<Env>,
    workers: HashMap<String, Handle>,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<String>,
    done_rx: mpsc::UnboundedReceiver<String>,
    sources_ready: bool,
    cancel: CancellationToken,
}

/// Compares pods ignoring fields that change without changing intent.
fn same_intent(a: &Pod, b: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut p = p.clone();
        if let Some(a) = p.metadata.annotations.as_mut() {
            a.remove(ANN_CONFIG_SEEN);
        }
        p.status = None;
        p.metadata.resource_version = None;
        p.metadata.managed_fields = None;
        p
    };
    strip(a) == strip(b)
}

impl SyncLoop {
    pub fn new(env: Arc<Env>, cancel: CancellationToken) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            env,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
            done_tx,
            done_rx,
            sources_ready: false,
            cancel,
        }
    }

    fn spawn(&mut self, pod: Pod, terminate: Option<i64>) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(g) = terminate {
            let _ = tx.send(Msg::Terminate(g));
        }
        let worker = Worker::new(self.env.clone(), pod.clone(), None);
        self.tasks.spawn(worker.run(rx, self.done_tx.clone(), self.cancel.child_token()));
        self.workers.insert(
            uid,
            Handle {
                tx,
                pod,
                terminating: terminate.is_some(),
            },
        );
    }

    /// A source's complete set of pods.
    pub fn set_pods(&mut self, pods: Vec<Pod>) {
        self.sources_ready = true;
        let mut wanted = std::collections::HashSet::new();
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            wanted.insert(uid.clone());
            match self.workers.get_mut(&uid) {
                Some(h) if h.terminating => {}
                Some(h) => {
                    if !same_intent(&h.pod, &pod) {
                        h.pod = pod.clone();
                        let _ = h.tx.send(Msg::Update(Box::new(pod)));
                    }
                }
                None => {
                    tracing::info!(pod = %crate::pod::full_name(&pod), %uid, "new pod");
                    self.spawn(pod, None);
                }
            }
        }
        for (uid, h) in self.workers.iter_mut() {
            if !wanted.contains(uid) && !h.terminating {
                let grace = h
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                tracing::info!(pod = %crate::pod::full_name(&h.pod), %uid, grace, "pod removed from its source; stopping");
                h.terminating = true;
                let _ = h.tx.send(Msg::Terminate(grace));
            }
        }
    }

    /// A PLEG relist.
    pub fn on_relist(&mut self, r: Relist) {
        for uid in &r.changed {
            if let Some(h) = self.workers.get(uid) {
                let _ = h.tx.send(Msg::Wake);
            }
        }
        if !self.sources_ready {
            return;
        }
        for uid in r.present {
            if !self.workers.contains_key(&uid) {
                tracing::info!(%uid, "runtime has a pod no source wants; stopping it");
                let mut pod = Pod::default();
                pod.metadata.uid = Some(uid);
                // Grace comes from the containers' annotations (see Worker::terminate).
                self.spawn(pod, Some(-1));
            }
        }
    }

    /// Number of live workers (for tests and metrics).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Runs until cancelled. Workers are left to finish their current step; pods keep running.
    pub async fn run(mut self, mut pods_rx: mpsc::Receiver<Vec<Pod>>, mut pleg_rx: mpsc::Receiver<Relist>) {
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                Some(pods) = pods_rx.recv() => self.set_pods(pods),
                Some(r) = pleg_rx.recv() => self.on_relist(r),
                Some(uid) = self.done_rx.recv() => {
                    self.workers.remove(&uid);
                }
            }
        }
        while self.tasks.join_next().await.is_some() {}
    }
}
