//! The routes step of a pass: bring the claims up to date (all of them on a full pass, the
//! changed Nodes' on an event pass), report new refusals, and make the kernel match the
//! accepted claims, touching only the destinations that changed.

use std::collections::BTreeSet;

use plumbing::cidr::Cidr;

use super::cidr_claims::{Claims, Policy};
use super::routes::{self, Added, Change, Route};
use super::{Controller, State};
use crate::events::{self, EventType};
use crate::objects::Changed;

impl Controller {
    /// Re-reads the kernel on a `full` pass and after the kernel reported a host change.
    /// Returns false when something failed (the caller retries soon, with a full pass).
    pub(super) async fn routes_step(&self, st: &mut State, own_cidrs: &[Cidr], full: bool) -> bool {
        let reread = full || std::mem::take(&mut st.kernel_changed);
        let dsts = match st.claims.as_mut() {
            Some(claims) if !reread => {
                let (position, changed) = self.nodes.changed_since(st.position);
                st.position = position;
                match changed {
                    Changed::Keys(keys) => {
                        for k in &keys {
                            claims.set_node(k, self.nodes.get(k));
                        }
                        if claims.policy().own_cidrs != own_cidrs {
                            // This Node's pod CIDRs changed: every claim is judged again
                            // (CPU only; the kernel facts stay those of the last full pass).
                            let policy = Policy {
                                own_cidrs: own_cidrs.to_vec(),
                                ..claims.policy().clone()
                            };
                            *claims = claims.with_policy(policy);
                            claims.take_dirty();
                            None
                        } else {
                            let mut d = claims.take_dirty();
                            d.extend(st.retry.iter().copied());
                            Some(d)
                        }
                    }
                    Changed::All => {
                        // A fresh list: every Node, judged against the last kernel facts.
                        let policy = Policy {
                            own_cidrs: own_cidrs.to_vec(),
                            ..claims.policy().clone()
                        };
                        *claims = self
                            .nodes
                            .read(|m| Claims::rebuild(&self.node_name, policy, m.values()));
                        claims.take_dirty();
                        st.reported.retain(|n| claims.node(n).is_some());
                        None
                    }
                }
            }
            _ => {
                let kernel = match self.routes.list().await {
                    Ok(k) => k,
                    Err(e) => {
                        tracing::warn!(error = %e, "node network: listing routes failed");
                        return false;
                    }
                };
                st.programmed = kernel.ours.iter().map(|r| (r.dst, r.via)).collect();
                let policy = Policy {
                    cluster_cidrs: self.settings.cluster_cidrs.clone(),
                    own_cidrs: own_cidrs.to_vec(),
                    host: kernel.host,
                };
                // The position first: a change landing while the store is read is applied
                // again by the next event pass, never lost.
                st.position = self.nodes.position();
                let mut claims = self
                    .nodes
                    .read(|m| Claims::rebuild(&self.node_name, policy, m.values()));
                claims.take_dirty();
                st.reported.retain(|n| claims.node(n).is_some());
                st.claims = Some(claims);
                None
            }
        };
        self.report(st);
        let Some(claims) = st.claims.as_ref() else {
            return true;
        };
        let changes = routes::plan(&st.programmed, claims.want(), dsts.as_ref());
        let mut ok = true;
        for change in changes {
            ok &= match change {
                Change::Delete(r) => self.delete(st, r).await,
                Change::Add(r) => self.add(st, r).await,
                Change::Move { from, to } => self.delete(st, from).await && self.add(st, to).await,
            };
        }
        ok
    }

    /// Logs each new refusal and records it as a Warning Event on the Node that made the
    /// claim (once per Node and reason, while it lasts).
    fn report(&self, st: &mut State) {
        let Some(claims) = st.claims.as_mut() else {
            return;
        };
        let touched: BTreeSet<String> = claims.take_touched();
        for name in touched {
            for (cidr, why) in st.reported.update(&name, claims.refusals(&name)) {
                let message = why.message(&name, cidr, &self.node_name);
                tracing::warn!(node = %name, pod_cidr = %cidr, reason = why.reason(), "{message}");
                let mut object = events::node_ref(&name);
                if let Some(uid) = claims.node(&name).map(|n| &n.uid).filter(|u| !u.is_empty()) {
                    object.uid = Some(uid.clone());
                }
                self.events
                    .record(&object, EventType::Warning, why.reason(), &message);
            }
        }
    }

    async fn add(&self, st: &mut State, r: Route) -> bool {
        match self.routes.add(r).await {
            Ok(Added::Added) => {
                tracing::info!(dst = %r.dst, via = %r.via, "route to a node's pods programmed");
                st.programmed.insert(r.dst, r.via);
                st.retry.remove(&r.dst);
                true
            }
            Ok(Added::Taken) => {
                // Not a route we know of: left as it is. The full pass this failure brings
                // reads whose it is (a route not ours refuses the claim, with an Event).
                tracing::warn!(dst = %r.dst, via = %r.via, "node network: a route to that destination is already there; left alone");
                st.programmed.remove(&r.dst);
                st.retry.remove(&r.dst);
                false
            }
            Err(e) => {
                tracing::warn!(dst = %r.dst, via = %r.via, error = %e, "node network: route not programmed; retrying");
                st.retry.insert(r.dst);
                false
            }
        }
    }

    async fn delete(&self, st: &mut State, r: Route) -> bool {
        match self.routes.delete(r).await {
            Ok(()) => {
                tracing::info!(dst = %r.dst, via = %r.via, "route to a node's pods removed");
                st.programmed.remove(&r.dst);
                st.retry.remove(&r.dst);
                true
            }
            Err(e) => {
                tracing::warn!(dst = %r.dst, error = %e, "node network: route not removed; retrying");
                st.retry.insert(r.dst);
                false
            }
        }
    }
}
