//! The IPVS mode's [`Backend`]: renders the desired virtual servers, `kube-ipvs0` addresses, ipsets and
//! the fixed iptables part, then brings the kernel there by difference. A full sync (the
//! first, the periodic one, one after a failure) reads the kernel (virtual servers, real
//! servers, bound addresses, the node's addresses); a partial sync reads only the real
//! servers of the virtual servers that change and trusts what it wrote for the rest.
//! Removed real servers of TCP services drain first (weight 0) and are deleted once they
//! hold no connection, as upstream's graceful termination does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::genl::{RealServer, VsKey};
use super::ipset::{self, Ipset, SetContents};
use super::kernel::{self, Answer, IpvsKernel, Op};
use super::render::{self, Desired, DesiredVs, IpvsSettings};
use crate::conntrack::{Conntrack, NoConntrack};
use crate::iptables::{IptablesRunner, Position, TableName};
use crate::metrics::Metrics;
use crate::model::{EndpointInfo, IpFamily, Protocol, ServicePortInfo, ServicePortName};
use crate::proxier::{self, ApplyInput, Backend, PlanInput};
use crate::render_config::RenderConfig;
use crate::sync_loop::SyncConfig;
use crate::tracker::ProxyHandle;

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
pub struct Applied {
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
struct Operations {
    now: Vec<Op>,
    after: Vec<Op>,
    draining: BTreeSet<Draining>,
}

/// The kernel's view one sync works from.
pub struct Observed {
    /// Virtual servers of this family with their real servers (read, or as written).
    services: BTreeMap<VsKey, (super::genl::VirtualServer, Vec<RealServer>)>,
    bound: BTreeSet<IpAddr>,
    node_ips: Vec<IpAddr>,
}

/// The IPVS mode's proxier of one family.
pub type IpvsProxier<K, S, R, C = NoConntrack> = proxier::Proxier<IpvsBackend<K, S, R>, C>;

/// The IPVS mode: its kernel edges (IPVS and the dummy interface over netlink, ipset, the
/// fixed iptables part), its settings and the real servers left draining.
pub struct IpvsBackend<K: IpvsKernel, S: Ipset, R: IptablesRunner> {
    kernel: K,
    ipset: S,
    iptables: R,
    ipvs: IpvsSettings,
    /// Real servers drained to weight 0, waiting for their connections to end.
    terminating: BTreeSet<Draining>,
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner> IpvsBackend<K, S, R> {
    /// `ipvs`: the `ipvs.*` settings (scheduler, excluded CIDRs).
    pub fn new(kernel: K, ipset: S, iptables: R, ipvs: IpvsSettings) -> Self {
        IpvsBackend {
            kernel,
            ipset,
            iptables,
            ipvs,
            terminating: BTreeSet::new(),
        }
    }
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner> IpvsProxier<K, S, R> {
    /// An IPVS proxier with the default `ipvs.*` settings (see [`IpvsProxier::with_ipvs`]).
    pub fn new(
        kernel: K,
        ipset: S,
        iptables: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        metrics: Metrics,
    ) -> Self {
        let backend = IpvsBackend::new(kernel, ipset, iptables, IpvsSettings::default());
        Self::with_backend(backend, cfg, handle, sync, metrics)
    }
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner, C: Conntrack> IpvsProxier<K, S, R, C> {
    /// The `ipvs.*` settings (scheduler, excluded CIDRs).
    pub fn with_ipvs(mut self, ipvs: IpvsSettings) -> Self {
        self.backend_mut().ipvs = ipvs;
        self
    }

    /// Real servers draining (weight 0) until their connections end.
    pub fn terminating(&self) -> usize {
        self.backend().terminating.len()
    }
}

/// One sync's desired state: the services and endpoints, as taken from the handle.
pub struct Snapshot {
    services: BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: BTreeMap<ServicePortName, Vec<EndpointInfo>>,
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner> Backend for IpvsBackend<K, S, R> {
    type Error = Error;
    type Known = Applied;
    /// A full sync reads the whole kernel first; a partial one reads, in `apply`, only
    /// the real servers of what changes.
    type Observed = Option<Observed>;
    type Plan = Snapshot;
    /// How many writes the sync took.
    type Written = usize;

    const NAME: &'static str = "IPVS";

    fn full_sync_period(sync: &SyncConfig) -> std::time::Duration {
        sync.full_sync_period.min(sync.sync_period)
    }

    /// The periodic check: the dummy interface still there (someone deleting it takes every
    /// service IP away); gone means the next sync reads and rewrites everything.
    async fn check_canary(&self, cfg: &RenderConfig, known: &mut Option<Applied>) -> bool {
        if known.is_none() {
            return false;
        }
        let r = self.kernel.batch(vec![Op::DummyAddrs(cfg.family)]).await;
        if !matches!(r.first(), Some(Ok(Answer::Addrs(Some(_))))) {
            warn!("kube-ipvs0 is gone: the next sync rewrites the IPVS rules");
            *known = None;
            return true;
        }
        false
    }

    async fn observe(
        &self,
        cfg: &RenderConfig,
        full: bool,
        _known: bool,
    ) -> Result<Self::Observed> {
        if full {
            self.observe_all(cfg).await.map(Some)
        } else {
            Ok(None)
        }
    }

    fn plan(&self, input: &PlanInput<'_>, _known: Option<&mut Applied>) -> Snapshot {
        Snapshot {
            services: input.state.service_port_map().clone(),
            endpoints: input.state.endpoints_map().clone(),
        }
    }

    /// Brings the kernel to the desired state; returns how many writes it took.
    async fn apply(
        &mut self,
        snapshot: Snapshot,
        observed: Self::Observed,
        input: ApplyInput<'_>,
        known: &mut Option<Applied>,
    ) -> Result<usize> {
        let (cfg, full) = (input.cfg, input.full);
        let (services, endpoints) = (&snapshot.services, &snapshot.endpoints);
        let (obs, want) = match (observed, known.as_ref()) {
            (None, Some(a)) => {
                let want = render::desired(cfg, &self.ipvs, services, endpoints, &a.node_ips);
                let mut touched: BTreeSet<VsKey> = self.terminating.iter().map(|t| t.0).collect();
                for (k, d) in &want.services {
                    if a.services.get(k) != Some(d) {
                        touched.insert(*k);
                    }
                }
                (self.observe_touched(a, &touched).await?, want)
            }
            (observed, _) => {
                let obs = match observed {
                    Some(obs) => obs,
                    None => self.observe_all(cfg).await?,
                };
                let want = render::desired(cfg, &self.ipvs, services, endpoints, &obs.node_ips);
                (obs, want)
            }
        };
        let Operations {
            now,
            after,
            draining,
        } = self.operations(&obs, &want);
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
        let family = cfg.family;
        let sets_text = match known.as_ref() {
            Some(a) => ipset::diff_text(family, &a.sets, &want.sets),
            None => ipset::replace_text(family, &want.sets),
        };
        if !sets_text.is_empty() {
            self.ipset.restore(&sets_text).await?;
            writes += 1;
        }
        let ipt = render::iptables_text(cfg, &want.sets);
        if full || known.as_ref().is_none_or(|a| a.iptables != ipt) {
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
        *known = Some(Applied {
            services: want.services,
            bound: want.bound,
            sets: want.sets,
            iptables: ipt,
            node_ips: obs.node_ips,
        });
        Ok(writes)
    }

    fn succeeded(
        &mut self,
        writes: &usize,
        _known: Option<&Applied>,
        _family: IpFamily,
        _metrics: &Metrics,
    ) -> usize {
        *writes
    }

    fn log_synced(&self, writes: &usize, full: bool, secs: f64) {
        info!(
            full,
            operations = *writes,
            elapsed = secs,
            "synced IPVS rules"
        );
    }

    /// What the kernel holds is unknown now: the next sync reads it all.
    fn failed(&mut self, e: &Error, _full: bool, _family: IpFamily, _metrics: &Metrics) -> bool {
        error!(error = %e, "IPVS sync failed; the next sync is a full one");
        true
    }
}

impl<K: IpvsKernel, S: Ipset, R: IptablesRunner> IpvsBackend<K, S, R> {
    /// Reads the kernel: every virtual server of this family with its real servers, the
    /// dummy's addresses and the node's own. Creates `kube-ipvs0` first.
    async fn observe_all(&self, cfg: &RenderConfig) -> Result<Observed> {
        let f = cfg.family;
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
            node_ips: render::node_port_ips(cfg, &local),
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
    fn operations(&self, obs: &Observed, want: &Desired) -> Operations {
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
        Operations {
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
}
