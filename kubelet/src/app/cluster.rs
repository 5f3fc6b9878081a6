//! Cluster mode: the kubelet as a member of a cluster (what `kubeadm join` sets up).
//!
//! [`connect`] gets credentials ([`bootstrap`]) and an apiserver [`client`]; [`start`] spawns
//! the long-running parts, each owning one concern and sharing only channels and the
//! [`PodStore`](crate::objects::PodStore):
//! - [`node`]: Node registration, node status, the node Lease;
//! - [`pods`]: the pod watch, admission, and `SourceUpdate { source: Api }` to the sync loop;
//! - [`mirror`]: mirror pods for static pods;
//! - [`status_writer`]: the only writer of pod status, and deletion of finished pods;
//! - [`events`]: core/v1 Events with aggregation and a spam filter;
//! - [`bootstrap`]: client certificate rotation;
//! - [`services`] and [`runtime_class`]: informers (through [`informer`]) for service-link
//!   variables and RuntimeClass handlers, read by the pod workers.

use crate::certs::bootstrap;
use crate::node;
use crate::objects::{client, events};
use crate::pod::{api as pods, mirror};
use crate::status::writer as status_writer;

use crate::config::Config;
use crate::events::EventRecorder;
use crate::pleg::PlegHealth;
use crate::runtime::Runtime;
use crate::status::StatusManager;
use crate::status::Terminated;
use crate::sync_loop::SourceUpdate;
use k8s_openapi::api::core::v1::Pod;
use std::net::IpAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why cluster mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("TLS bootstrap: {0}")]
    Bootstrap(#[from] bootstrap::BootstrapError),
    #[error(transparent)]
    Client(#[from] client::ClientError),
}

/// Credentials and a client, ready for [`start`].
pub struct Connected {
    pub client: client::ClientHandle,
    publisher: client::ClientPublisher,
    limiter: client::RateLimitLayer,
}

/// Makes sure `--kubeconfig` is usable (TLS bootstrap if needed) and builds the client.
/// `Ok(None)`: cancelled while waiting.
pub async fn connect(
    cfg: &Config,
    cancel: &CancellationToken,
) -> Result<Option<Connected>, ClusterError> {
    let kubeconfig = cfg.kubeconfig.clone().unwrap_or_default();
    let settings = bootstrap::BootstrapSettings {
        node_name: cfg.node_name.clone(),
        kubeconfig: kubeconfig.clone(),
        bootstrap_kubeconfig: cfg.bootstrap_kubeconfig.clone(),
        cert_dir: cfg.cert_dir.clone(),
    };
    match bootstrap::ensure_kubeconfig(&settings, cancel).await {
        Ok(()) => {}
        Err(bootstrap::BootstrapError::Cancelled) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let limiter =
        client::RateLimitLayer::new(f64::from(cfg.kube_api_qps), cfg.kube_api_burst as u32);
    let c = client::build(&kubeconfig, &limiter).await?;
    let (client, publisher) = client::ClientHandle::new(c);
    Ok(Some(Connected {
        client,
        publisher,
        limiter,
    }))
}

/// What the cluster parts need from the rest of the kubelet.
pub struct Parts {
    /// The device manager: Node capacity and admission of device requests.
    pub devices: Arc<crate::devices::DeviceManager>,
    pub node_ips: Vec<IpAddr>,
    pub runtime: Arc<dyn Runtime>,
    pub pleg: Arc<PlegHealth>,
    pub statuses: Arc<StatusManager>,
    /// Where the admitted API pods go (the sync loop's source channel).
    pub pods_tx: mpsc::Sender<SourceUpdate>,
    /// The current static pods (for mirror pods and the maxPods count).
    pub static_rx: watch::Receiver<Vec<Pod>>,
    /// The recorder the workers got and the sink that writes what it records ([`events::channel`]).
    pub events: (Arc<dyn EventRecorder>, events::EventSink),
    /// Set while the node shuts down: NotReady, and new pods rejected.
    pub shutdown: Arc<crate::shutdown::ShutdownState>,
    /// The eviction manager's pressure conditions (node status, admission).
    pub pressure: Arc<crate::eviction::PressureState>,
    /// The volumes in use for `status.volumesInUse`.
    pub volumes: Option<Arc<dyn node::VolumesInUse>>,
    /// The pods' allocated resources (admission decides resizes).
    pub allocations: Arc<crate::allocation::Allocations>,
}

/// Handles the rest of the kubelet keeps.
pub struct Started {
    /// Give this to `SyncLoop::on_terminated`.
    pub terminated_tx: mpsc::UnboundedSender<Terminated>,
}

/// Spawns every cluster-mode task into `tasks`.
pub fn start(
    cfg: &Config,
    conn: Connected,
    parts: Parts,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Started {
    let node_rx = start_node(cfg, &conn, &parts, &parts.events.0, tasks, cancel);
    let (recorder, sink) = parts.events;
    tasks.spawn(sink.run(conn.client.clone(), cancel.clone()));
    let store = crate::objects::PodStore::default();
    tasks.spawn(crate::objects::watch_pods(
        conn.client.clone(),
        cfg.node_name.clone(),
        store.clone(),
        cancel.clone(),
    ));
    let (terminated_tx, terminated_rx) = mpsc::unbounded_channel();
    parts.statuses.keep_removed();
    tasks.spawn(
        pods::Dispatcher {
            node_name: cfg.node_name.clone(),
            max_pods: cfg.max_pods,
            sysctls: crate::pod::SysctlAllowlist::new(&cfg.allowed_unsafe_sysctls)
                .unwrap_or_default(),
            store: store.clone(),
            statuses: parts.statuses.clone(),
            events: recorder.clone(),
            node_rx: node_rx.clone(),
            static_rx: parts.static_rx.clone(),
            pods_tx: parts.pods_tx,
            terminated_tx: terminated_tx.clone(),
            shutdown: parts.shutdown.clone(),
            pressure: parts.pressure.clone(),
            pod_level_resources: cfg.pod_limits.pod_level_resources,
            devices: Some(parts.devices.clone()),
            allocations: parts.allocations.clone(),
        }
        .run(cancel.clone()),
    );
    tasks.spawn(
        mirror::MirrorPods {
            client: conn.client.clone(),
            store: store.clone(),
            static_rx: parts.static_rx,
            node_rx,
        }
        .run(cancel.clone()),
    );
    tasks.spawn(
        status_writer::StatusWriter {
            client: conn.client.clone(),
            node_name: cfg.node_name.clone(),
            store,
            statuses: parts.statuses,
            terminated_rx,
        }
        .run(cancel.clone()),
    );

    start_rotation(cfg, conn, tasks, cancel);
    Started { terminated_tx }
}

/// Node registration and status ([`node::NodeStatusLoop`], when `registerNode`) and the node
/// Lease. Returns the Node object as last written (None until then, and standalone).
fn start_node(
    cfg: &Config,
    conn: &Connected,
    parts: &Parts,
    recorder: &Arc<dyn EventRecorder>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> watch::Receiver<Option<k8s_openapi::api::core::v1::Node>> {
    let (node_tx, node_rx) = watch::channel(None);
    let node_cfg = node::NodeConfig {
        name: cfg.node_name.clone(),
        labels: cfg.node_labels.clone(),
        taints: cfg.register_with_taints.clone(),
        node_ips: parts.node_ips.clone(),
        hostname: cfg.node_name.clone(),
        port: cfg.port,
        max_pods: cfg.max_pods,
        update_frequency: cfg.node_status_update_frequency,
        report_frequency: cfg.node_status_report_frequency,
        lease_duration_seconds: cfg.node_lease_duration_seconds,
        register_node: cfg.register_node,
        max_images: cfg.node_status_max_images,
        resources: cfg.resources.clone(),
        cloud: cfg.cloud.clone(),
        given_node_ips: cfg.node_ips.clone(),
    };
    let health = Arc::new(node::CriHealth {
        runtime: parts.runtime.clone(),
        pleg: parts.pleg.clone(),
        started_unix: crate::clock::unix_now(),
        shutdown: parts.shutdown.clone(),
        pressure: parts.pressure.clone(),
    });
    if node_cfg.register_node {
        tasks.spawn(
            node::NodeStatusLoop {
                volumes: parts.volumes.clone(),
                cfg: node_cfg,
                client: conn.client.clone(),
                host: Arc::new(node::LinuxHost {
                    root_dir: cfg.root_dir.clone(),
                }),
                health,
                events: recorder.clone(),
                node_tx,
                devices: Some(parts.devices.clone()),
            }
            .run(cancel.clone()),
        );
    } else {
        tracing::warn!("registerNode is false: no Node object, status or lease is written");
    }
    tasks.spawn(
        node::LeaseLoop {
            node_name: cfg.node_name.clone(),
            lease_duration_seconds: cfg.node_lease_duration_seconds,
            client: conn.client.clone(),
            node_rx: node_rx.clone(),
        }
        .run(cancel.clone()),
    );

    node_rx
}

/// Client certificate rotation, when `rotateCertificates` and the kubeconfig's credentials
/// are files the kubelet manages.
fn start_rotation(
    cfg: &Config,
    conn: Connected,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    let kubeconfig = cfg.kubeconfig.clone().unwrap_or_default();
    if cfg.rotate_certificates && bootstrap::Rotator::manages(&kubeconfig, &cfg.cert_dir) {
        tasks.spawn(
            bootstrap::Rotator {
                node_name: cfg.node_name.clone(),
                kubeconfig,
                bootstrap_kubeconfig: cfg.bootstrap_kubeconfig.clone(),
                cert_dir: cfg.cert_dir.clone(),
                limiter: conn.limiter,
                publisher: conn.publisher,
                handle: conn.client,
            }
            .run(cancel.clone()),
        );
    }
}
