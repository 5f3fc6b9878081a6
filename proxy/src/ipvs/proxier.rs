//! The IPVS proxier: renders the desired virtual servers, `kube-ipvs0` addresses, ipsets and
//! the fixed iptables part, then brings the kernel there by difference. A full sync (the
//! first, the periodic one, one after a failure) reads the kernel (virtual servers, real
//! servers, bound addresses, the node's addresses); a partial sync reads only the real
//! servers of the virtual servers that change and trusts what it wrote for the rest.
//! Removed real servers of TCP services drain first (weight 0) and are deleted once they
//! hold no connection, as upstream's graceful termination does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use thiserror::Error;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::genl::{RealServer, VsKey};
use super::ipset::{self, Ipset, SetContents};
use super::kernel::{self, Answer, IpvsKernel, Op};
use super::render::{self, Desired, DesiredVs, IpvsSettings};
use crate::conntrack::{self, Conntrack, NoConntrack};
use crate::health::ServiceHealthServer;
use crate::health::health_check_state;
use crate::iptables::{IptablesRunner, Position, TableName};
use crate::metrics::Metrics;
use crate::model::{IpFamily, Protocol};
use crate::render_config::RenderConfig;
use crate::success::record_success;
use crate::sync_loop::{ProxyBackend, SyncConfig, SyncOutcome};
use crate::tracker::{ProxyHandle, set_pending};

#[derive(Debug, Error)]
pub enum Error {
    #[error("IPVS sync: {0}")]
    Kernel(String),
    #[error("ipset restore: {0}")]
    Ipset(#[from] ipset::Error),
    #[error("iptables: {0}")]
    Iptables(#[from] crate::iptables::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the last successful sync wrote (the kernel's state as far as this process knows).
#[derive(Clone, Debug, Default)]
struct Applied {
    services: BTreeMap<VsKey, DesiredVs>,
    bound: BTreeSet<IpAddr>,
    sets: SetContents,
    iptables: String,
    node_ips: Vec<IpAddr>,
}

/// A real server drained to weight 0: (virtual server, address, port).
type Draining = (VsKey, IpAddr, u16);

/// What one sync does to IPVS: `now` (new and changed virtual servers, real servers and
/// addresses, before the rules), `after` (removals, after the rules), and the real servers
/// left draining.
struct Plan {
    now: Vec<Op>,
    after: Vec<Op>,
    draining: BTreeSet<Draining>,
}

/// The kernel's view one sync works from.
struct Observed {
    /// Virtual servers of this family with their real servers (read, or as written).
    services: BTreeMap<VsKey, (super::genl::VirtualServer, Vec<RealServer>)>,
    bound: BTreeSet<IpAddr>,
    node_ips: Vec<IpAddr>,
}

pub struct IpvsProxier<K: IpvsKernel, S: Ipset, R: IptablesRunner, C: Conntrack = NoConntrack> {
    kernel: K,
    ipset: S,
    iptables: R,
    conntrack: C,
    service_health: Option<ServiceHealthServer>,
    cfg: RenderConfig,
    ipvs: IpvsSettings,
    handle: ProxyHandle,
    metrics: Metrics,
    full_sync_period: Duration,
    node_ips_from_node: bool,
    applied: Option<Applied>,
    /// Real servers drained to weight 0, waiting for their connections to end.
    terminating: BTreeSet<Draining>,
    last_full: Option<Instant>,
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner> IpvsProxier<K, S, R> {
    pub fn new(
        kernel: K,
        ipset: S,
        iptables: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        metrics: Metrics,
    ) -> Self {
        handle.set_metrics(metrics.clone());
        IpvsProxier {
            kernel,
            ipset,
            iptables,
            conntrack: NoConntrack,
            service_health: None,
            node_ips_from_node: cfg.node_ips.is_empty(),
            cfg,
            ipvs: IpvsSettings::default(),
            handle,
            metrics,
            full_sync_period: sync.full_sync_period.min(sync.sync_period),
            applied: None,
            terminating: BTreeSet::new(),
            last_full: None,
        }
    }
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner, C: Conntrack> IpvsProxier<K, S, R, C> {
    pub fn with_conntrack<C2: Conntrack>(self, conntrack: C2) -> IpvsProxier<K, S, R, C2> {
        IpvsProxier {
            kernel: self.kernel,
            ipset: self.ipset,
            iptables: self.iptables,
            conntrack,
            service_health: self.service_health,
            cfg: self.cfg,
            ipvs: self.ipvs,
            handle: self.handle,
            metrics: self.metrics,
            full_sync_period: self.full_sync_period,
            node_ips_from_node: self.node_ips_from_node,
            applied: self.applied,
            terminating: self.terminating,
            last_full: self.last_full,
        }
    }

    /// The `ipvs.*` settings (scheduler, excluded CIDRs).
    pub fn with_ipvs(mut self, ipvs: IpvsSettings) -> Self {
        self.ipvs = ipvs;
        self
    }

    pub fn with_service_health(mut self, server: ServiceHealthServer) -> Self {
        self.service_health = Some(server);
        self
    }

    pub fn handle(&self) -> &ProxyHandle {
        &self.handle
    }

    /// Real servers draining (weight 0) until their connections end.
    pub fn terminating(&self) -> usize {
        self.terminating.len()
    }

    fn family(&self) -> IpFamily {
        self.cfg.family
    }

    /// Reads the kernel: every virtual server of this family with its real servers, the
    /// dummy's addresses and the node's own. Creates `kube-ipvs0` first.
    async fn observe_all(&self) -> Result<Observed> {
        let f = self.family();
        let mut r = self
            .kernel
            .batch(vec![
                Op::EnsureDummy,
                Op::ListServices,
                Op::DummyAddrs(f),
                Op::LocalAddrs(f),
            ])
            .await
            .into_iter();
        let mut next = || r.next().unwrap_or(Ok(Answer::Done));
        next().map_err(|e| Error::Kernel(e.to_string()))?;
        let services = match next().map_err(|e| Error::Kernel(e.to_string()))? {
            Answer::Services(v) => v,
            _ => Vec::new(),
        };
        let bound = match next().map_err(|e| Error::Kernel(e.to_string()))? {
            Answer::Addrs(a) => a.unwrap_or_default(),
            _ => BTreeSet::new(),
        };
        let local = match next().map_err(|e| Error::Kernel(e.to_string()))? {
            Answer::Addrs(a) => a.unwrap_or_default(),
            _ => BTreeSet::new(),
        };
        let services: Vec<_> = services
            .into_iter()
            .filter(|vs| f.matches(&vs.key.addr))
            .collect();
        let dests = self
            .kernel
            .batch(services.iter().map(|vs| Op::ListDests(vs.key)).collect())
            .await;
        let mut out = BTreeMap::new();
        for (vs, d) in services.into_iter().zip(dests) {
            let d = match d {
                Ok(Answer::Dests(d)) => d,
                Ok(_) => Vec::new(),
                Err(e) => return Err(Error::Kernel(e.to_string())),
            };
            out.insert(vs.key, (vs, d));
        }
        Ok(Observed {
            services: out,
            bound,
            node_ips: render::node_port_ips(&self.cfg, &local),
        })
    }

    /// The kernel as written last time, with the real servers of `touched` read afresh
    /// (their connection counts decide graceful deletion).
    async fn observe_touched(
        &self,
        applied: &Applied,
        touched: &BTreeSet<VsKey>,
    ) -> Result<Observed> {
        let mut services: BTreeMap<_, _> = applied
            .services
            .iter()
            .map(|(k, d)| {
                let rs = d
                    .dests
                    .iter()
                    .map(|(ip, port)| RealServer::new(*ip, *port, 1))
                    .collect();
                (*k, (d.vs.clone(), rs))
            })
            .collect();
        let keys: Vec<VsKey> = touched
            .iter()
            .filter(|k| services.contains_key(k))
            .copied()
            .collect();
        let answers = self
            .kernel
            .batch(keys.iter().map(|k| Op::ListDests(*k)).collect())
            .await;
        for (k, a) in keys.iter().zip(answers) {
            match a {
                Ok(Answer::Dests(d)) => {
                    if let Some(e) = services.get_mut(k) {
                        e.1 = d;
                    }
                }
                // Gone behind our back: a full sync will put it back.
                Ok(_) | Err(_) => return Err(Error::Kernel(format!("{k} changed outside"))),
            }
        }
        Ok(Observed {
            services,
            bound: applied.bound.clone(),
            node_ips: applied.node_ips.clone(),
        })
    }

    /// The IPVS operations from `obs` to `want`, and the real servers left draining.
    fn plan(&self, obs: &Observed, want: &Desired) -> Plan {
        let mut now = Vec::new();
        let mut after = Vec::new();
        let mut draining = BTreeSet::new();
        for (k, d) in &want.services {
            let current = obs.services.get(k);
            match current {
                None => now.push(Op::AddService(d.vs.clone())),
                Some((vs, _)) if d.vs.differs(vs) => now.push(Op::UpdateService(d.vs.clone())),
                Some(_) => {}
            }
            let have: BTreeMap<(IpAddr, u16), &RealServer> = current
                .map(|(_, rs)| rs.iter().map(|r| ((r.addr, r.port), r)).collect())
                .unwrap_or_default();
            for (ip, port) in &d.dests {
                match have.get(&(*ip, *port)) {
                    None => now.push(Op::AddDest(*k, RealServer::new(*ip, *port, 1))),
                    Some(r) if r.weight != 1 => {
                        now.push(Op::UpdateDest(*k, RealServer::new(*ip, *port, 1)))
                    }
                    Some(_) => {}
                }
            }
            for ((ip, port), r) in &have {
                if d.dests.contains(&(*ip, *port)) {
                    continue;
                }
                // UDP and SCTP have no connection end to wait for (expire_nodest_conn
                // drops their flows on the next packet): deleted at once, as upstream.
                let graceful = k.protocol == Protocol::Tcp;
                if !graceful || r.active_conns + r.inactive_conns == 0 {
                    now.push(Op::DeleteDest(*k, RealServer::new(*ip, *port, 0)));
                } else {
                    if r.weight != 0 {
                        now.push(Op::UpdateDest(*k, RealServer::new(*ip, *port, 0)));
                    }
                    draining.insert((*k, *ip, *port));
                }
            }
        }
        for k in obs.services.keys() {
            if !want.services.contains_key(k)
                && !render::excluded(&self.ipvs.exclude_cidrs, &k.addr)
            {
                after.push(Op::DeleteService(*k));
            }
        }
        for ip in want.bound.difference(&obs.bound) {
            now.push(Op::AddAddr(*ip));
        }
        for ip in obs.bound.difference(&want.bound) {
            if !render::excluded(&self.ipvs.exclude_cidrs, ip) {
                after.push(Op::DelAddr(*ip));
            }
        }
        Plan {
            now,
            after,
            draining,
        }
    }

    async fn ensure_jumps(&self) -> Result<()> {
        for (table, from, to, comment) in render::JUMPS {
            let t = if *table == "nat" {
                TableName::Nat
            } else {
                TableName::Filter
            };
            self.iptables.ensure_chain(t, to).await?;
            let args: Vec<String> = ["-m", "comment", "--comment", comment, "-j", to]
                .iter()
                .map(|s| s.to_string())
                .collect();
            self.iptables
                .ensure_rule(Position::Prepend, t, from, &args)
                .await?;
        }
        Ok(())
    }

    pub async fn sync(&mut self, full: bool) -> Result<SyncOutcome> {
        if !self.handle.initialized() {
            debug!("not syncing IPVS until Services and EndpointSlices are synced");
            return Ok(SyncOutcome::NotInitialized);
        }
        let started = std::time::Instant::now();
        let node = self.handle.state().node().clone();
        let node_changed = self.cfg.adopt_node(&node, self.node_ips_from_node);
        let stale_full = self
            .last_full
            .is_none_or(|t| t.elapsed() >= self.full_sync_period);
        let do_full = full || stale_full || node_changed || self.applied.is_none();

        let (services, endpoints, changed, triggers, hc) = {
            let mut st = self.handle.state();
            let changed = st.take_changes();
            let triggers = st.take_trigger_times();
            set_pending(&self.metrics, &st);
            let hc = self
                .service_health
                .is_some()
                .then(|| health_check_state(&st));
            (
                st.service_port_map().clone(),
                st.endpoints_map().clone(),
                changed,
                triggers,
                hc,
            )
        };
        let result = self.write(do_full, &services, &endpoints).await;
        let fam = self.family().label();
        let secs = started.elapsed().as_secs_f64();
        self.metrics.observe_sync(fam, secs, do_full);
        match result {
            Ok(written) => {
                if do_full {
                    self.last_full = Some(Instant::now());
                }
                self.metrics.observe_programmed(fam, &triggers);
                let udp = conntrack::udp_targets(&services, &endpoints);
                record_success(
                    &self.handle,
                    self.family(),
                    self.service_health.as_ref(),
                    hc.as_ref(),
                    &self.conntrack,
                    &udp,
                )
                .await;
                if written == 0 {
                    return Ok(SyncOutcome::Unchanged);
                }
                info!(
                    full = do_full,
                    operations = written,
                    elapsed = secs,
                    "synced IPVS rules"
                );
                Ok(SyncOutcome::Applied {
                    full: do_full,
                    changed_services: changed.len(),
                    bytes: written,
                })
            }
            Err(e) => {
                // What the kernel holds is unknown now: the next sync reads it all.
                self.applied = None;
                error!(error = %e, "IPVS sync failed; the next sync is a full one");
                Err(e)
            }
        }
    }

    /// Brings the kernel to the desired state; returns how many writes it took.
    async fn write(
        &mut self,
        full: bool,
        services: &BTreeMap<crate::model::ServicePortName, crate::model::ServicePortInfo>,
        endpoints: &BTreeMap<crate::model::ServicePortName, Vec<crate::model::EndpointInfo>>,
    ) -> Result<usize> {
        let applied = if full { None } else { self.applied.clone() };
        let node_ips = match &applied {
            Some(a) => a.node_ips.clone(),
            None => Vec::new(),
        };
        let (obs, want) = match &applied {
            Some(a) => {
                let want = render::desired(&self.cfg, &self.ipvs, services, endpoints, &node_ips);
                let mut touched: BTreeSet<VsKey> = self.terminating.iter().map(|t| t.0).collect();
                for (k, d) in &want.services {
                    if a.services.get(k) != Some(d) {
                        touched.insert(*k);
                    }
                }
                (self.observe_touched(a, &touched).await?, want)
            }
            None => {
                let obs = self.observe_all().await?;
                let want =
                    render::desired(&self.cfg, &self.ipvs, services, endpoints, &obs.node_ips);
                (obs, want)
            }
        };
        let Plan {
            now,
            after,
            draining,
        } = self.plan(&obs, &want);
        let mut writes = now.len() + after.len();
        let mut failures = Vec::new();
        for r in self.kernel.batch(now).await {
            if let Err(e) = r {
                failures.push(e.to_string());
            }
        }

        // ipsets before the iptables rules that match on them.
        // Written afresh (every set swapped in whole) when nothing is known; else the
        // difference to what was written.
        let sets_text = match self.applied.as_ref() {
            Some(a) => ipset::diff_text(self.family(), &a.sets, &want.sets),
            None => ipset::replace_text(self.family(), &want.sets),
        };
        if !sets_text.is_empty() {
            self.ipset.restore(&sets_text).await?;
            writes += 1;
        }
        let ipt = render::iptables_text(&self.cfg, &want.sets);
        if full || self.applied.as_ref().is_none_or(|a| a.iptables != ipt) {
            if full {
                self.ensure_jumps().await?;
            }
            self.iptables.restore(&ipt, true).await?;
            writes += 1;
        }
        for r in self.kernel.batch(after).await {
            match r {
                Err(e) if !kernel::is_gone(&e) => failures.push(e.to_string()),
                _ => {}
            }
        }
        self.terminating = draining;
        if !failures.is_empty() {
            return Err(Error::Kernel(failures.join("; ")));
        }
        if !self.terminating.is_empty() {
            debug!(
                draining = self.terminating.len(),
                "real servers drain before deletion"
            );
        }
        self.applied = Some(Applied {
            services: want.services,
            bound: want.bound,
            sets: want.sets,
            iptables: ipt,
            node_ips: obs.node_ips,
        });
        Ok(writes)
    }

    /// The periodic check: the dummy interface still there (someone deleting it takes every
    /// service IP away); gone means the next sync reads and rewrites everything.
    pub async fn check_canary(&mut self) {
        if self.applied.is_none() {
            return;
        }
        let r = self.kernel.batch(vec![Op::DummyAddrs(self.family())]).await;
        if !matches!(r.first(), Some(Ok(Answer::Addrs(Some(_))))) {
            warn!("kube-ipvs0 is gone: the next sync rewrites the IPVS rules");
            self.applied = None;
        }
    }
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner, C: Conntrack> ProxyBackend
    for IpvsProxier<K, S, R, C>
{
    type Error = Error;

    fn handle(&self) -> &ProxyHandle {
        &self.handle
    }

    fn family(&self) -> IpFamily {
        self.cfg.family
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn check_canary(&mut self) {
        IpvsProxier::check_canary(self).await
    }

    async fn sync(&mut self, full: bool) -> Result<SyncOutcome> {
        IpvsProxier::sync(self, full).await
    }
}
