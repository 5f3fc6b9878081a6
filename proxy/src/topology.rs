//! Endpoint selection shared by every backend: which endpoints of a service port the
//! "Cluster" and "Local" traffic policies reach, with topology hints (upstream's
//! pkg/proxy/topology.go, `CategorizeEndpoints`).

use crate::model::{EndpointInfo, ServicePortInfo};

/// Endpoints split by traffic policy (upstream's CategorizeEndpoints, without topology hints).
#[derive(Clone, Debug)]
pub struct Categorized<'a> {
    /// Endpoints of the "Cluster" policy, topology hints applied.
    pub cluster: Vec<&'a EndpointInfo>,
    /// This node's endpoints, for the "Local" policy.
    pub local: Vec<&'a EndpointInfo>,
    /// `cluster` then what `local` adds: every endpoint some rule of the service reaches.
    pub all_reachable: Vec<&'a EndpointInfo>,
    /// Whether the service has any usable endpoint (ready, or serving and terminating).
    pub has_any: bool,
}

/// Which topology hints the cluster endpoints are chosen by (upstream's topologyModeFromHints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologyMode {
    /// Every ready endpoint.
    None,
    /// Endpoints hinted for this node (PreferSameNode).
    SameNode,
    /// Endpoints hinted for this node's zone (PreferSameZone / PreferClose).
    SameZone,
}

/// Node hints win when every ready endpoint has some and one is for this node; else zone
/// hints when every ready endpoint has some and one is for this node's zone; else none
/// (hints are all-or-nothing, so a half-hinted service never loses endpoints).
pub fn topology_mode(eps: &[EndpointInfo], node_name: &str, zone: Option<&str>) -> TopologyMode {
    let ready = || eps.iter().filter(|e| e.ready);
    let has = |hints: &[String], name: &str| hints.iter().any(|h| h == name);
    if ready().all(|e| !e.node_hints.is_empty()) && ready().any(|e| has(&e.node_hints, node_name)) {
        return TopologyMode::SameNode;
    }
    if let Some(zone) = zone
        && ready().all(|e| !e.zone_hints.is_empty())
        && ready().any(|e| has(&e.zone_hints, zone))
    {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

pub fn categorize<'a>(
    eps: &'a [EndpointInfo],
    svc: &ServicePortInfo,
    node_name: &str,
    zone: Option<&str>,
) -> Categorized<'a> {
    let mut cluster = Vec::new();
    let mut local = Vec::new();
    let mut has_any = false;
    if svc.uses_cluster_endpoints() {
        let mode = topology_mode(eps, node_name, zone);
        let wanted = |e: &EndpointInfo| match mode {
            TopologyMode::None => true,
            TopologyMode::SameNode => e.node_hints.iter().any(|h| h == node_name),
            TopologyMode::SameZone => zone.is_some_and(|z| e.zone_hints.iter().any(|h| h == z)),
        };
        cluster = eps.iter().filter(|e| e.ready && wanted(e)).collect();
        if cluster.is_empty() {
            // No ready endpoints anywhere (a topology mode is only chosen when one is
            // ready here): fall back to serving-but-terminating ones.
            cluster = eps.iter().filter(|e| e.serving && e.terminating).collect();
        }
        has_any = !cluster.is_empty();
    }
    if !svc.uses_local_endpoints() {
        let all_reachable = cluster.clone();
        return Categorized {
            cluster,
            local,
            all_reachable,
            has_any,
        };
    }
    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for e in eps {
        if e.ready {
            has_any = true;
            local_ready |= e.is_local;
        } else if e.serving && e.terminating {
            has_any = true;
            local_serving_terminating |= e.is_local;
        }
    }
    if local_ready {
        local = eps.iter().filter(|e| e.is_local && e.ready).collect();
    } else if local_serving_terminating {
        local = eps
            .iter()
            .filter(|e| e.is_local && e.serving && e.terminating)
            .collect();
    }
    if !svc.uses_cluster_endpoints() {
        let all_reachable = local.clone();
        return Categorized {
            cluster,
            local,
            all_reachable,
            has_any,
        };
    }
    let mut all_reachable = cluster.clone();
    for e in &local {
        if !all_reachable
            .iter()
            .any(|x| x.ip == e.ip && x.port == e.port)
        {
            all_reachable.push(e);
        }
    }
    Categorized {
        cluster,
        local,
        all_reachable,
        has_any,
    }
}
