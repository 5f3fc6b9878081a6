//! The sync loop: the one place desired pods meet workers. Pod sources send full sets, the
//! PLEG says which pods changed in the runtime; the loop starts a worker per new UID, forwards
//! spec changes, asks removed pods to terminate, and stops pods the runtime has that no source
//! wants (once every source has reported at least once).

use crate::pleg::Relist;
use crate::pod_worker::{Deps, Msg, Worker};
use crate::podspec::{ANN_CONFIG_SEEN, Source};
use crate::shutdown::PodStopper;
use crate::status::Terminated;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A source's complete, current set of pods.
#[derive(Debug, Clone)]
pub struct SourceUpdate {
    pub source: Source,
    pub pods: Vec<Pod>,
}

/// Requests from inside the kubelet (the node shutdown manager, later eviction) that act on
/// pods through their workers.
#[derive(Debug)]
pub enum Control {
    /// The pods that have a worker and are not being removed.
    ActivePods(tokio::sync::oneshot::Sender<Vec<Pod>>),
    /// The UIDs of every pod with a worker (terminating ones too), once every source has
    /// reported (None before: nothing may be taken as gone yet). Container GC reads it.
    KnownPods(tokio::sync::oneshot::Sender<Option<std::collections::HashSet<String>>>),
    /// Stop one pod for good (it ends Failed as `stopped` says); `done` fires once nothing of it
    /// runs (or at once when the pod has no worker).
    Stop {
        uid: String,
        stopped: crate::podspec::Stopped,
        grace: Duration,
        done: tokio::sync::oneshot::Sender<()>,
    },
    /// Sync these pods again (upstream's `HandlePodSyncs` for the container manager's
    /// updates: a device's health changed, so their status is computed anew).
    Resync(Vec<String>),
}

/// The sync loop as the node shutdown manager's [`PodStopper`] (`Control::ActivePods` /
/// `Control::Stop` over its control channel).
#[async_trait::async_trait]
impl PodStopper for mpsc::Sender<Control> {
    async fn active_pods(&self) -> Vec<Pod> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.send(Control::ActivePods(tx)).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    async fn stop(
        &self,
        uid: String,
        stopped: crate::podspec::Stopped,
        grace: Duration,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let msg = Control::Stop {
            uid,
            stopped,
            grace,
            done,
        };
        self.send(msg).await.ok().map(|()| rx)
    }
}

struct Handle {
    tx: mpsc::UnboundedSender<Msg>,
    pod: Pod,
    source: Option<Source>,
    terminating: bool,
}

/// Routes desired state and runtime events to per-pod workers.
pub struct SyncLoop {
    env: Arc<Deps>,
    workers: HashMap<String, Handle>,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<String>,
    done_rx: mpsc::UnboundedReceiver<String>,
    ready: HashSet<Source>,
    expected: HashSet<Source>,
    on_terminated: Option<mpsc::UnboundedSender<Terminated>>,
    cancel: CancellationToken,
    /// When orphaned pod directories were last looked for.
    last_cleanup: Option<tokio::time::Instant>,
    health: Arc<SyncLoopHealth>,
    control_tx: mpsc::Sender<Control>,
    control_rx: Option<mpsc::Receiver<Control>>,
    /// Test hook (`KUBELET_TEST_WEDGE_SYNC_LOOP_FILE`): while this file exists the loop stops
    /// turning, as a deadlocked loop would (the systemd watchdog test uses it).
    wedge_file: Option<std::path::PathBuf>,
}

/// When the sync loop last went round (upstream's syncLoopMonitor): the loop turns at least
/// once a second, so a stale beat means it is stuck.
#[derive(Debug)]
pub struct SyncLoopHealth {
    start: std::time::Instant,
    last_ms: std::sync::atomic::AtomicU64,
}

impl Default for SyncLoopHealth {
    fn default() -> Self {
        Self {
            start: std::time::Instant::now(),
            last_ms: Default::default(),
        }
    }
}

impl SyncLoopHealth {
    pub fn beat(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// A heartbeat that never turned, created `age` ago (tests).
    #[cfg(test)]
    pub(crate) fn created_ago(age: Duration) -> Self {
        Self {
            start: std::time::Instant::now() - age,
            last_ms: Default::default(),
        }
    }

    /// Time since the last turn (since creation when it never turned).
    pub fn since_last_turn(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// The env variable naming the sync loop's wedge file (a test hook; see [`SyncLoop`]).
pub const WEDGE_FILE_ENV: &str = "KUBELET_TEST_WEDGE_SYNC_LOOP_FILE";

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

/// How often directories of pods nobody knows are looked for.
const ORPHAN_CLEANUP_PERIOD: Duration = Duration::from_secs(30);
/// A pod directory younger than this is never taken for an orphan.
const ORPHAN_MIN_AGE: Duration = Duration::from_secs(60);

impl SyncLoop {
    /// `sources` are the sources that must each report once before pods that no source wants
    /// are stopped (so that a restart does not kill pods the apiserver has not listed yet).
    pub fn new(env: Arc<Deps>, sources: &[Source], cancel: CancellationToken) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (control_tx, control_rx) = mpsc::channel(16);
        Self {
            env,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
            done_tx,
            done_rx,
            ready: HashSet::new(),
            expected: sources.iter().copied().collect(),
            on_terminated: None,
            cancel,
            last_cleanup: None,
            health: Arc::default(),
            control_tx,
            control_rx: Some(control_rx),
            wedge_file: std::env::var_os(WEDGE_FILE_ENV).map(Into::into),
        }
    }

    /// Where [`Control`] requests go.
    pub fn control(&self) -> mpsc::Sender<Control> {
        self.control_tx.clone()
    }

    fn on_control(&mut self, c: Control) {
        match c {
            Control::KnownPods(reply) => {
                let known = self
                    .sources_ready()
                    .then(|| self.workers.keys().cloned().collect());
                let _ = reply.send(known);
            }
            Control::ActivePods(reply) => {
                let pods = self
                    .workers
                    .values()
                    .filter(|h| !h.terminating)
                    .map(|h| h.pod.clone())
                    .collect();
                let _ = reply.send(pods);
            }
            Control::Stop {
                uid,
                stopped,
                grace,
                done,
            } => {
                if let Some(h) = self.workers.get(&uid) {
                    // A worker that ends first drops `done`, which also counts as done.
                    let _ = h.tx.send(Msg::Stop {
                        stopped,
                        grace,
                        done,
                    });
                } else {
                    let _ = done.send(());
                }
            }
            Control::Resync(uids) => {
                for uid in uids {
                    if let Some(h) = self.workers.get(&uid) {
                        tracing::debug!(%uid, "container manager: device health changed; syncing the pod");
                        let _ = h.tx.send(Msg::Wake);
                    }
                }
            }
        }
    }

    /// The loop's heartbeat (read by the systemd watchdog and `/healthz`).
    pub fn health(&self) -> Arc<SyncLoopHealth> {
        self.health.clone()
    }

    /// The test hook: while the wedge file exists, stop turning (until cancelled).
    async fn wedged(&self) {
        let Some(f) = &self.wedge_file else { return };
        if tokio::fs::try_exists(f).await.unwrap_or(false) {
            tracing::warn!(file = %f.display(), "test hook: the sync loop is wedged");
            self.cancel.cancelled().await;
        }
    }

    /// Pods whose termination finished are sent here (the apiserver writer deletes them).
    pub fn on_terminated(&mut self, tx: mpsc::UnboundedSender<Terminated>) {
        self.on_terminated = Some(tx);
    }

    fn sources_ready(&self) -> bool {
        self.expected.iter().all(|s| self.ready.contains(s))
    }

    /// A worker for `pod`; `terminate` Some makes it stop the pod at once (with that grace, or
    /// the one recorded on its containers when None).
    fn spawn(&mut self, pod: Pod, source: Option<Source>, terminate: Option<Option<Duration>>) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(grace) = terminate {
            let _ = tx.send(Msg::Terminate { grace });
        }
        let worker = Worker::new(self.env.clone(), pod.clone(), None);
        self.tasks
            .spawn(worker.run(rx, self.done_tx.clone(), self.cancel.child_token()));
        self.workers.insert(
            uid,
            Handle {
                tx,
                pod,
                source,
                terminating: terminate.is_some(),
            },
        );
    }

    /// A source's complete set of pods.
    pub fn set_pods(&mut self, source: Source, pods: Vec<Pod>) {
        self.ready.insert(source);
        let mut wanted = HashSet::new();
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            // Mirror pods only reflect static pods on the apiserver: never run them.
            let mirror = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(crate::podspec::ANN_CONFIG_MIRROR));
            if uid.is_empty() || mirror {
                continue;
            }
            wanted.insert(uid.clone());
            // A pod being deleted on the apiserver stops with the grace period it was given.
            let deleting = crate::podspec::deletion_grace(&pod);
            match self.workers.get_mut(&uid) {
                Some(h) if h.terminating => {}
                Some(h) => {
                    if !same_intent(&h.pod, &pod) {
                        h.pod = pod.clone();
                        let _ = h.tx.send(Msg::Update(Box::new(pod)));
                    }
                    if let Some(grace) = deleting {
                        tracing::info!(pod = %crate::podspec::full_name(&h.pod), %uid, ?grace, "pod deleted; stopping");
                        h.terminating = true;
                        let _ = h.tx.send(Msg::Terminate { grace: Some(grace) });
                    }
                }
                None => {
                    tracing::info!(pod = %crate::podspec::full_name(&pod), %uid, "new pod");
                    self.spawn(pod, Some(source), deleting.map(Some));
                }
            }
        }
        for (uid, h) in self.workers.iter_mut() {
            if h.source == Some(source) && !wanted.contains(uid) && !h.terminating {
                let grace = crate::podspec::kill_grace(crate::podspec::spec_grace_seconds(&h.pod));
                tracing::info!(pod = %crate::podspec::full_name(&h.pod), %uid, ?grace, "pod removed from its source; stopping");
                h.terminating = true;
                let _ = h.tx.send(Msg::Terminate { grace: Some(grace) });
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
        if !self.sources_ready() {
            return;
        }
        if self
            .last_cleanup
            .is_none_or(|t| t.elapsed() >= ORPHAN_CLEANUP_PERIOD)
        {
            self.last_cleanup = Some(tokio::time::Instant::now());
            self.cleanup_orphaned_dirs(&r.present);
        }
        for uid in r.present {
            if !self.workers.contains_key(&uid) {
                tracing::info!(%uid, "runtime has a pod no source wants; stopping it");
                let mut pod = Pod::default();
                pod.metadata.uid = Some(uid);
                // Grace comes from the containers' annotations (see Worker::terminate).
                self.spawn(pod, None, Some(None));
            }
        }
    }

    /// Removes directories of pods neither a worker nor the runtime knows (they ended while
    /// the agent was down), on the blocking pool.
    fn cleanup_orphaned_dirs(&self, present: &std::collections::BTreeSet<String>) {
        let mut known: HashSet<String> = self.workers.keys().cloned().collect();
        known.extend(present.iter().cloned());
        let binder = self.env.binder.clone();
        let pods_dir = self.env.node.root_dir.join("pods");
        let userns = self.env.userns.clone();
        tokio::task::spawn_blocking(move || {
            for uid in
                crate::pod_dirs::remove_orphans(binder.as_ref(), &pods_dir, &known, ORPHAN_MIN_AGE)
            {
                tracing::info!(%uid, "removed an orphaned pod directory");
                if let Some(u) = &userns {
                    u.release(&uid);
                }
            }
        });
    }

    /// Number of live workers (for tests and metrics).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Runs until cancelled. Workers are left to finish their current step; pods keep running.
    pub async fn run(
        mut self,
        mut pods_rx: mpsc::Receiver<SourceUpdate>,
        mut pleg_rx: mpsc::Receiver<Relist>,
        mut probe_rx: mpsc::Receiver<probes::ProbeUpdate>,
    ) {
        self.turn(&mut pods_rx, &mut pleg_rx, &mut probe_rx).await;
        while self.tasks.join_next().await.is_some() {}
    }

    /// The loop itself, until cancelled.
    async fn turn(
        &mut self,
        pods_rx: &mut mpsc::Receiver<SourceUpdate>,
        pleg_rx: &mut mpsc::Receiver<Relist>,
        probe_rx: &mut mpsc::Receiver<probes::ProbeUpdate>,
    ) {
        // Upstream's loop also wakes every second (syncCh) whatever else happens.
        let mut control_rx = self.control_rx.take().expect("run once");
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.health.beat();
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                _ = tick.tick() => self.wedged().await,
                Some(c) = control_rx.recv() => self.on_control(c),
                Some(u) = probe_rx.recv() => {
                    if let Some(h) = self.workers.get(&u.pod_uid) {
                        let _ = h.tx.send(Msg::Probe(Box::new(u)));
                    }
                }
                Some(u) = pods_rx.recv() => self.set_pods(u.source, u.pods),
                Some(r) = pleg_rx.recv() => self.on_relist(r),
                // A worker's task ends after its pod did: collect it, or the set keeps every
                // finished task's allocation for the agent's lifetime.
                Some(res) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(e) = res
                        && e.is_panic()
                    {
                        tracing::error!(error = %e, "pod worker panicked");
                    }
                }
                Some(uid) = self.done_rx.recv() => {
                    if let Some(h) = self.workers.remove(&uid)
                        && let Some(tx) = &self.on_terminated
                    {
                        let _ = tx.send(Terminated { source: h.source, pod: h.pod });
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_settings::NodeSettings;
    use crate::runtime::fake::FakeRuntime;
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn env(rt: Arc<FakeRuntime>, dir: &std::path::Path) -> Arc<Deps> {
        Arc::new(Deps {
            node: NodeSettings {
                pod_logs_dir: dir.join("logs"),
                root_dir: dir.join("root"),
                ..Default::default()
            },
            ..Deps::for_test(rt, dir)
        })
    }

    fn pod(uid: &str, extra_meta: serde_json::Value) -> Pod {
        let mut meta = serde_json::json!({"name": uid, "namespace": "default", "uid": uid});
        for (k, v) in extra_meta.as_object().unwrap() {
            meta[k] = v.clone();
        }
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox:1.35"}]}
        }))
        .unwrap();
        crate::podspec::apply_defaults(&mut p);
        p
    }

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn sources_merge_mirrors_are_ignored_and_deletions_stop_pods() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("busybox:1.35");
        let cancel = CancellationToken::new();
        let mut sl = SyncLoop::new(
            env(rt.clone(), dir.path()),
            &[Source::File, Source::Api],
            cancel.clone(),
        );
        let (tx, mut rx) = mpsc::unbounded_channel();
        sl.on_terminated(tx);
        sl.set_pods(Source::File, vec![pod("static", serde_json::json!({}))]);
        sl.set_pods(
            Source::Api,
            vec![
                pod("api", serde_json::json!({})),
                pod(
                    "mirror",
                    serde_json::json!({"annotations": {"kubernetes.io/config.mirror": "x"}}),
                ),
            ],
        );
        assert_eq!(sl.workers(), 2, "the mirror pod is not run");
        // Both pods' containers start (bounded wait: a loaded machine schedules slowly).
        for _ in 0..250 {
            if rt.running("c").len() == 2 {
                break;
            }
            settle().await;
        }
        assert_eq!(rt.running("c").len(), 2);
        // The apiserver marks the API pod deleted: it stops, and is reported terminated.
        let deleted = pod(
            "api",
            serde_json::json!({"deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 1}),
        );
        sl.set_pods(Source::Api, vec![deleted]);
        // The file source's own update must not touch API pods.
        sl.set_pods(Source::File, vec![pod("static", serde_json::json!({}))]);
        let done = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                tokio::select! {
                    Some(uid) = sl.done_rx.recv() => {
                        if let Some(h) = sl.workers.remove(&uid) && let Some(tx) = &sl.on_terminated {
                            let _ = tx.send(Terminated { source: h.source, pod: h.pod });
                        }
                    }
                    Some(t) = rx.recv() => break t,
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(done.pod.metadata.uid.as_deref(), Some("api"));
        assert_eq!(done.source, Some(Source::Api));
        assert_eq!(rt.running("c").len(), 1, "the static pod keeps running");
        cancel.cancel();
    }

    /// A worker's task ends with its pod; the loop must not keep it. A finished task held in
    /// the loop's set keeps its whole allocation (sized for the worker's future), so an agent
    /// whose pods come and go grew by that much per pod (the soak saw it).
    #[tokio::test]
    async fn finished_workers_are_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("busybox:1.35");
        let cancel = CancellationToken::new();
        let mut sl = SyncLoop::new(env(rt.clone(), dir.path()), &[Source::File], cancel.clone());
        let (term_tx, mut term_rx) = mpsc::unbounded_channel();
        sl.on_terminated(term_tx);
        let (pods_tx, mut pods_rx) = mpsc::channel(8);
        let (_pleg_tx, mut pleg_rx) = mpsc::channel(8);
        let (_probe_tx, mut probe_rx) = mpsc::channel(8);
        let cycles = 3;
        let drive = async {
            for round in 0..cycles {
                let uid = format!("p{round}");
                pods_tx
                    .send(SourceUpdate {
                        source: Source::File,
                        pods: vec![pod(&uid, serde_json::json!({}))],
                    })
                    .await
                    .unwrap();
                for _ in 0..250 {
                    if rt.running("c").len() == 1 {
                        break;
                    }
                    settle().await;
                }
                assert_eq!(rt.running("c").len(), 1, "round {round}: the pod runs");
                pods_tx
                    .send(SourceUpdate {
                        source: Source::File,
                        pods: vec![],
                    })
                    .await
                    .unwrap();
                let t = tokio::time::timeout(Duration::from_secs(10), term_rx.recv())
                    .await
                    .expect("the pod stops")
                    .unwrap();
                assert_eq!(t.pod.metadata.uid.as_deref(), Some(uid.as_str()));
            }
            // The last worker has reported; let its task return and the loop notice.
            for _ in 0..10 {
                settle().await;
            }
        };
        tokio::select! {
            _ = sl.turn(&mut pods_rx, &mut pleg_rx, &mut probe_rx) => panic!("the loop ended"),
            _ = drive => {}
        }
        assert_eq!(sl.workers(), 0);
        assert_eq!(
            sl.tasks.len(),
            0,
            "{cycles} pods came and went; their finished tasks are still held"
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn orphans_are_stopped_only_after_every_source_reported() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::new());
        let cancel = CancellationToken::new();
        let mut sl = SyncLoop::new(
            env(rt.clone(), dir.path()),
            &[Source::File, Source::Api],
            cancel.clone(),
        );
        let relist = Relist {
            changed: BTreeSet::new(),
            present: BTreeSet::from(["left-over".to_string()]),
        };
        sl.on_relist(relist.clone());
        sl.set_pods(Source::File, vec![]);
        sl.on_relist(relist.clone());
        assert_eq!(
            sl.workers(),
            0,
            "the apiserver has not listed yet: the pod may still be wanted"
        );
        sl.set_pods(Source::Api, vec![]);
        sl.on_relist(relist);
        assert_eq!(sl.workers(), 1, "now the unknown pod is stopped");
        cancel.cancel();
    }
}
