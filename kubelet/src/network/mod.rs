//! The node network controller (`nodeAgentNetwork`, ours): the agent's side of the
//! `node-agent-cni` plugin, in the role upstream's removed kubenet or flannel's host-gw
//! backend play. From a Nodes informer it
//! - installs the plugin binary into the CNI bin dir (only when its content differs);
//! - writes the conflist into the runtime's CNI config dir once this Node has its
//!   `spec.podCIDRs` (until then the runtime reports NetworkReady=false and the Node is not
//!   Ready, with upstream's message);
//! - programs a route to other Nodes' pod CIDRs via their InternalIP ([`routes`]), for the
//!   claims that pass [`cidr_claims`]' checks (inside the cluster CIDR, no overlap with this node
//!   or an older Node, an on-link next hop that is not this node's); a refused claim is a
//!   warning and a Warning Event on that Node, once per (Node, reason);
//! - masquerades pod traffic leaving the cluster CIDR ([`masquerade`]).
//!
//! A node whose CNI config dir holds any other configuration is left alone (one log line).
//! The controller is level-triggered: a full pass every [`RESYNC_PERIOD`] re-checks the files
//! (another configuration appearing, the plugin replaced), re-reads the kernel's routes,
//! judges every Node's claims afresh and rewrites the masquerade table. A pass on a watch
//! event is incremental: it takes the Nodes that changed from the store's journal, judges
//! only their claims (and those overlapping them), and acts on the routes that changed; it
//! touches the CNI files only when this Node's pod CIDRs changed.
//! A link or address change the kernel reports (rtnetlink's link and address groups,
//! [`routes::HostChanges`]) brings, [`HOST_SETTLE`] later, a pass that re-reads the kernel's
//! routes and judges every claim against them (an interface brought up after the start makes
//! its peers' on-link next hops valid at once, not at the next full pass).

pub mod cidr_claims;
pub mod cni_files;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod masquerade;
mod route_step;
pub mod routes;
pub mod settings;
pub mod util_chains;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use plumbing::cidr::Cidr;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::EventRecorder;
use crate::objects::ClientHandle;
use crate::objects::{Store, informer};
use cidr_claims::{Claims, Reported};
use masquerade::Masquerade;
use plumbing::rtnl::HostChange;
use routes::{HostChanges, Routes};
pub use settings::Settings;

/// How often the kernel's routes are re-read and the masquerade table rewritten.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(30);
/// How long after the first of a burst of link or address changes the kernel is re-read
/// (a veth pair brought up is several notifications, and the kernel adds an address's
/// routes just after it reports the address).
pub const HOST_SETTLE: Duration = Duration::from_millis(200);
/// How soon a pass that failed somewhere is retried.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// How many Node changes the store remembers for event passes; more between two passes
/// and the next one judges every Node.
pub const JOURNAL_CAP: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("netlink: {0}")]
    Netlink(String),
    #[error("masquerade: {0}")]
    Masquerade(String),
    #[error("CNI files: {0}")]
    Files(String),
}

/// What the controller reads of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNet {
    pub name: String,
    /// `metadata.uid` (for Events about the Node).
    pub uid: String,
    /// `metadata.creationTimestamp`: the older Node wins overlapping pod CIDRs.
    pub created: Option<jiff::Timestamp>,
    /// `spec.podCIDRs` (or `spec.podCIDR`), the ones that parse.
    pub pod_cidrs: Vec<Cidr>,
    /// `status.addresses` of type InternalIP, in order.
    pub internal_ips: Vec<IpAddr>,
}

impl NodeNet {
    pub fn from_node(n: &Node) -> NodeNet {
        let spec = n.spec.clone().unwrap_or_default();
        let texts = match spec.pod_cidrs {
            Some(list) if !list.is_empty() => list,
            _ => spec.pod_cidr.into_iter().collect(),
        };
        NodeNet {
            name: n.metadata.name.clone().unwrap_or_default(),
            uid: n.metadata.uid.clone().unwrap_or_default(),
            created: n.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pod_cidrs: texts
                .iter()
                .filter_map(|t| t.parse::<Cidr>().ok())
                .map(|c| c.network())
                .collect(),
            internal_ips: n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect(),
        }
    }
}

/// Every Node, by name.
pub type NodeStore = Store<NodeNet>;

/// What a pass found in the CNI config dir.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Files {
    /// Another configuration is there: nothing is done on this node.
    LeftAlone(Vec<String>),
    /// This Node has no pod CIDR yet: no conflist.
    NoPodCidr {
        installed: bool,
    },
    Ready {
        installed: bool,
        written: bool,
    },
    /// Not looked at: an event pass, and this Node's pod CIDRs are what the files were
    /// last made for.
    Unchanged,
}

/// What the controller remembers between passes.
#[derive(Debug, Default)]
pub struct State {
    /// Our routes as last seen in or written to the kernel.
    pub programmed: BTreeMap<Cidr, IpAddr>,
    /// Every Node's claims, judged (`None` until the first full pass after the Nodes are
    /// listed).
    pub claims: Option<Claims>,
    /// The Node store's journal position the claims are up to.
    position: u64,
    /// Refusals already logged and reported as Events.
    reported: Reported,
    /// Destinations whose last change failed: the next event pass tries them again.
    retry: BTreeSet<Cidr>,
    plugin_ok: bool,
    /// The pod CIDRs the conflist was last made for (`Some(vec![])`: none yet); an event
    /// pass skips the file work while this Node's CIDRs stay the same.
    files_for: Option<Vec<Cidr>>,
    masq_ok: bool,
    left_alone: bool,
    warned_no_cluster_cidr: bool,
    /// The kernel reported a link or address change: the next pass re-reads the routes
    /// (and judges every claim against them) even when it is not a full one.
    kernel_changed: bool,
}

/// The controller; [`Controller::run`] until cancelled.
pub struct Controller {
    pub node_name: String,
    pub settings: Settings,
    /// The plugin binary to install (`None`: not found; every pass reports it).
    pub plugin: Option<PathBuf>,
    pub nodes: Arc<NodeStore>,
    pub routes: Arc<dyn Routes>,
    pub masquerade: Arc<dyn Masquerade>,
    /// Refused claims become Warning Events on the Node that made them.
    pub events: Arc<dyn EventRecorder>,
    /// The kernel's link and address changes (`None`: only the periodic full pass learns
    /// of them).
    pub host_changes: Option<Box<dyn HostChanges>>,
}

impl Controller {
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut host = self.host_changes.take();
        let mut changes = self.nodes.subscribe();
        let mut st = State::default();
        let mut next_full = Instant::now();
        // When the kernel's reported changes are acted on (the first of a burst + settle).
        let mut settle: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let full = now >= next_full;
            if settle.is_some_and(|t| now >= t) {
                settle = None;
                st.kernel_changed = true;
            }
            let ok = self.pass(&mut st, full).await;
            if full {
                next_full = Instant::now() + RESYNC_PERIOD;
            }
            if !ok {
                next_full = next_full.min(Instant::now() + RETRY_AFTER);
            }
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = crate::objects::changed(&mut changes) => break,
                    _ = tokio::time::sleep_until(next_full) => break,
                    _ = tokio::time::sleep_until(settle.unwrap_or(next_full)), if settle.is_some() => break,
                    change = next_host_change(&mut host) => match change {
                        Some(what) => {
                            tracing::debug!(?what, "node network: the kernel reported a host change");
                            settle.get_or_insert(Instant::now() + HOST_SETTLE);
                        }
                        None => {
                            tracing::warn!("node network: the kernel's link and address notifications stopped; interfaces are re-read every {}s only", RESYNC_PERIOD.as_secs());
                            host = None;
                        }
                    },
                }
            }
        }
    }

    /// One pass; `full` also re-reads the kernel's routes and judges every Node afresh.
    /// Returns false when a step failed (the caller retries soon).
    pub async fn pass(&self, st: &mut State, full: bool) -> bool {
        if !self.nodes.has_synced() {
            return true;
        }
        // Nodes are keyed by name: this Node without going over the others.
        let own = self.nodes.get(&self.node_name);
        let own = own.as_ref();
        let own_cidrs = own.map(|n| n.pod_cidrs.clone()).unwrap_or_default();
        let mut ok = true;
        let files = if !full && st.plugin_ok && st.files_for.as_ref() == Some(&own_cidrs) {
            Ok(Files::Unchanged)
        } else {
            self.files(st, own, full).await
        };
        st.files_for = match &files {
            Ok(Files::NoPodCidr { .. } | Files::Ready { .. } | Files::Unchanged) => Some(own_cidrs),
            _ => None,
        };
        match files {
            Ok(Files::Unchanged) => {}
            Ok(Files::LeftAlone(others)) => {
                if !st.left_alone {
                    tracing::warn!(
                        dir = %self.settings.cni_conf_dir.display(),
                        files = ?others,
                        "another CNI configuration is present: node-agent networking leaves this node alone (no conflist, routes or masquerade)"
                    );
                    st.left_alone = true;
                }
                return true;
            }
            Ok(Files::NoPodCidr { installed }) => {
                st.left_alone = false;
                self.log_install(st, installed);
            }
            Ok(Files::Ready { installed, written }) => {
                st.left_alone = false;
                self.log_install(st, installed);
                if written {
                    let cidrs = own.map(|n| n.pod_cidrs.clone()).unwrap_or_default();
                    tracing::info!(
                        path = %self.settings.cni_conf_dir.join(cni_files::CONFLIST_NAME).display(),
                        pod_cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        "wrote the CNI configuration"
                    );
                }
            }
            Err(e) => {
                st.plugin_ok = false;
                tracing::warn!(error = %e, "node network: CNI files not ready; retrying");
                ok = false;
            }
        }
        ok &= self.masquerade_step(st, full).await;
        ok &= self.routes_step(st, own_cidrs_of(own), full).await;
        ok
    }

    fn log_install(&self, st: &mut State, installed: bool) {
        if installed {
            tracing::info!(
                path = %self.settings.cni_bin_dir.join(settings::PLUGIN_NAME).display(),
                "installed the CNI plugin"
            );
        }
        st.plugin_ok = true;
    }

    async fn files(
        &self,
        st: &State,
        own: Option<&NodeNet>,
        full: bool,
    ) -> Result<Files, NetworkError> {
        let conf_dir = self.settings.cni_conf_dir.clone();
        let bin_dir = self.settings.cni_bin_dir.clone();
        let plugin = self.plugin.clone();
        let install = full || !st.plugin_ok;
        let subnets = own.map(|n| n.pod_cidrs.clone()).unwrap_or_default();
        let (mtu, data_dir) = (self.settings.mtu, self.settings.data_dir.clone());
        let err = |what: &str, e: std::io::Error| NetworkError::Files(format!("{what}: {e}"));
        tokio::task::spawn_blocking(move || {
            let others = cni_files::other_configs(&conf_dir)
                .map_err(|e| err(&format!("reading {}", conf_dir.display()), e))?;
            if !others.is_empty() {
                return Ok(Files::LeftAlone(others));
            }
            let mut installed = false;
            if install {
                let src = plugin.ok_or_else(|| {
                    NetworkError::Files(format!(
                        "no {} to install: set nodeAgentNetwork.pluginPath",
                        settings::PLUGIN_NAME
                    ))
                })?;
                installed = cni_files::install_plugin(&src, &bin_dir)
                    .map_err(|e| err(&format!("installing into {}", bin_dir.display()), e))?;
            }
            if subnets.is_empty() {
                return Ok(Files::NoPodCidr { installed });
            }
            let text = cni_files::render_conflist(&cni_files::ConfInput {
                subnets,
                mtu,
                data_dir,
                portmap: cni_files::has_portmap(&bin_dir),
            });
            let written = cni_files::write_conflist(&conf_dir, &text)
                .map_err(|e| err(&format!("writing into {}", conf_dir.display()), e))?;
            Ok(Files::Ready { installed, written })
        })
        .await
        .map_err(|e| NetworkError::Files(format!("file task: {e}")))?
    }

    async fn masquerade_step(&self, st: &mut State, full: bool) -> bool {
        let cidrs = &self.settings.cluster_cidrs;
        if cidrs.is_empty() {
            if !st.warned_no_cluster_cidr {
                tracing::warn!(
                    "nodeAgentNetwork.clusterCIDR is not set: pod traffic leaving the node is not masqueraded, and no route to another Node's pods is made"
                );
                st.warned_no_cluster_cidr = true;
            }
            return true;
        }
        if st.masq_ok && !full {
            return true;
        }
        match self.masquerade.apply(cidrs).await {
            Ok(()) => {
                if !st.masq_ok {
                    tracing::info!(cluster_cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(), "masquerading pod traffic that leaves the cluster CIDR");
                }
                st.masq_ok = true;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "node network: masquerade rules not written; retrying");
                st.masq_ok = false;
                false
            }
        }
    }
}

/// The next change `host` reports; pending forever without one.
async fn next_host_change(host: &mut Option<Box<dyn HostChanges>>) -> Option<HostChange> {
    match host {
        Some(h) => h.next().await,
        None => std::future::pending().await,
    }
}

fn own_cidrs_of(own: Option<&NodeNet>) -> &[Cidr] {
    own.map_or(&[], |n| n.pod_cidrs.as_slice())
}

/// Starts the Nodes informer and the controller (cluster mode, `nodeAgentNetwork.enabled`).
pub fn start(
    client: ClientHandle,
    node_name: String,
    settings: Settings,
    events: Arc<dyn EventRecorder>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Result<(), NetworkError> {
    let nodes = Arc::new(NodeStore::with_journal(JOURNAL_CAP));
    let exe = std::env::current_exe().ok();
    let plugin = cni_files::plugin_source(&settings, exe.as_deref());
    let routes = Arc::new(routes::NetlinkRoutes::new()?);
    let host_changes: Option<Box<dyn HostChanges>> = match plumbing::rtnl::Monitor::open() {
        Ok(m) => Some(Box::new(m)),
        Err(e) => {
            tracing::warn!(error = %e, "node network: cannot follow the kernel's link and address changes; interfaces are re-read every {}s only", RESYNC_PERIOD.as_secs());
            None
        }
    };
    tasks.spawn(informer::run(
        client,
        "nodes",
        NodeNet::from_node,
        nodes.clone(),
        cancel.clone(),
    ));
    tracing::info!(
        conf_dir = %settings.cni_conf_dir.display(),
        bin_dir = %settings.cni_bin_dir.display(),
        plugin = ?plugin,
        "node network controller starting"
    );
    tasks.spawn(
        Controller {
            node_name,
            settings,
            plugin,
            nodes,
            routes,
            masquerade: Arc::new(masquerade::NftMasquerade),
            events,
            host_changes,
        }
        .run(cancel.clone()),
    );
    Ok(())
}

#[cfg(test)]
mod bench_tests;
#[cfg(test)]
mod claim_tests;
#[cfg(test)]
mod netns_tests;
#[cfg(test)]
mod tests;
