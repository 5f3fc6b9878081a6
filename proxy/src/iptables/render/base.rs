//! The top-level chains (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, ...) with their
//! fixed rules, which depend on the configuration only; the services' rules go between their
//! head and tail.

use super::{RenderConfig, q};
use crate::iptables::chains::*;
use crate::iptables::ruleset::Rule;
use crate::model::IpFamily;
use crate::nodeport::NodePortAddresses;
use plumbing::iptables::TableName;

/// A top-level chain: fixed rules around the services' rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BaseChain {
    pub(super) name: &'static str,
    pub(super) head: Vec<Rule>,
    pub(super) tail: Vec<Rule>,
}

impl BaseChain {
    fn new(name: &'static str) -> Self {
        BaseChain {
            name,
            head: Vec::new(),
            tail: Vec::new(),
        }
    }

    pub(super) fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.head.iter().chain(&self.tail)
    }
}

/// The top-level chains of both tables, which depend on the configuration only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Base {
    pub(super) filter: Vec<BaseChain>,
    pub(super) nat: Vec<BaseChain>,
}

impl Base {
    pub(super) fn new(cfg: &RenderConfig) -> Self {
        let mark = cfg.masquerade_mark();
        let npa = NodePortAddresses::new(cfg.family, &cfg.node_port_addresses, &cfg.node_ips);
        let is_v6 = cfg.family == IpFamily::V6;
        let localhost_node_ports =
            cfg.localhost_node_ports && !is_v6 && npa.contains_ipv4_loopback();
        let plain = |args: String| Rule {
            args,
            pinned_last: false,
        };

        let mut filter: Vec<BaseChain> = [
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_FORWARD,
            KUBE_NODEPORTS,
            KUBE_PROXY_FIREWALL,
        ]
        .into_iter()
        .map(BaseChain::new)
        .collect();
        let mut nat: Vec<BaseChain> = [
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
        ]
        .into_iter()
        .map(BaseChain::new)
        .collect();

        let postrouting = &mut nat[2].head;
        postrouting.push(plain(format!("-m mark ! --mark {mark}/{mark} -j RETURN")));
        postrouting.push(plain(format!("-j MARK --xor-mark {mark}")));
        let mut masq = format!(
            "-m comment --comment {} -j MASQUERADE",
            q("kubernetes service traffic requiring SNAT")
        );
        if cfg.random_fully {
            masq.push_str(" --random-fully");
        }
        postrouting.push(plain(masq));
        nat[3].head.push(plain(format!("-j MARK --or-mark {mark}")));

        if localhost_node_ports {
            // Mitigates the route_localnet hole (upstream issue 90259); kubelet keeps an
            // identical copy of this rule.
            let mut fw = BaseChain::new(KUBE_FIREWALL);
            fw.head.push(plain(format!(
                "-m comment --comment {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                q("block incoming localnet connections")
            )));
            filter.push(fw);
        }

        // The jump to KUBE-NODEPORTS must stay the last rule of nat KUBE-SERVICES.
        let np_comment =
            q("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
        let pinned = |args: String| Rule {
            args,
            pinned_last: true,
        };
        let services_tail = &mut nat[0].tail;
        if npa.match_all() {
            let mut dest = String::from("-m addrtype --dst-type LOCAL");
            if is_v6 {
                dest.push_str(" ! -d ::1/128");
            } else if !localhost_node_ports {
                dest.push_str(" ! -d 127.0.0.0/8");
            }
            services_tail.push(pinned(format!(
                "-m comment --comment {np_comment} {dest} -j {KUBE_NODEPORTS}"
            )));
        } else {
            for ip in cfg.node_ips.iter().filter(|ip| npa.contains(ip)) {
                if ip.is_loopback() && (is_v6 || !localhost_node_ports) {
                    continue;
                }
                services_tail.push(pinned(format!(
                    "-m comment --comment {np_comment} -d {ip} -j {KUBE_NODEPORTS}"
                )));
            }
        }

        let forward = &mut filter[2].tail;
        if !cfg.conntrack_tcp_liberal {
            forward.push(plain("-m conntrack --ctstate INVALID -j DROP".to_string()));
        }
        forward.push(plain(format!(
            "-m comment --comment {} -m mark --mark {mark}/{mark} -j ACCEPT",
            q("kubernetes forwarding rules")
        )));
        forward.push(plain(format!(
            "-m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            q("kubernetes forwarding conntrack rule")
        )));
        Base { filter, nat }
    }

    pub(super) fn table(&self, t: TableName) -> &[BaseChain] {
        match t {
            TableName::Filter => &self.filter,
            _ => &self.nat,
        }
    }

    pub(super) fn rule_count(&self, t: TableName) -> usize {
        self.table(t).iter().map(|c| c.rules().count()).sum()
    }
}
