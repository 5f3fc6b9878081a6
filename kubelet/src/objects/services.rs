//! Service links: the Services informer and the `FOO_SERVICE_HOST` / docker-link variables
//! every container gets (upstream's `getServiceEnvVarMap` and `pkg/kubelet/envvars`).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Service;

use super::informer::Store;

/// One Service port as the variables need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
}

/// What the variables read of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: String,
    pub ports: Vec<ServicePort>,
}

impl ServiceInfo {
    pub fn from_service(s: &Service) -> Self {
        let spec = s.spec.clone().unwrap_or_default();
        ServiceInfo {
            namespace: s.metadata.namespace.clone().unwrap_or_default(),
            name: s.metadata.name.clone().unwrap_or_default(),
            cluster_ip: spec.cluster_ip.unwrap_or_default(),
            ports: spec
                .ports
                .unwrap_or_default()
                .into_iter()
                .map(|p| ServicePort {
                    name: p.name.unwrap_or_default(),
                    port: p.port,
                    protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                })
                .collect(),
        }
    }

    /// Upstream's IsServiceIPSet: a ClusterIP that is neither empty nor `None`.
    fn has_ip(&self) -> bool {
        !self.cluster_ip.is_empty() && self.cluster_ip != "None"
    }
}

/// Every Service in the cluster, by `namespace/name`.
pub type ServiceStore = Store<ServiceInfo>;

/// Services whose variables every pod gets, from the `default` namespace, even with
/// `enableServiceLinks: false` (upstream's masterServices).
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// Why the variables cannot be built yet.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("services have not yet been read at least once, cannot construct envvars")]
pub struct NotSynced;

fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// Upstream's envvars.FromServices: for each Service with a ClusterIP, `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT` (first port), `<NAME>_SERVICE_PORT_<PORTNAME>` per named port, and
/// the docker-link variables `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`.
pub fn from_services(services: &[ServiceInfo]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in services {
        if !s.has_ip() || s.ports.is_empty() {
            continue;
        }
        let prefix = var_name(&s.name);
        out.push((format!("{prefix}_SERVICE_HOST"), s.cluster_ip.clone()));
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), s.ports[0].port.to_string()));
        for p in s.ports.iter().filter(|p| !p.name.is_empty()) {
            out.push((
                format!("{port_var}_{}", var_name(&p.name)),
                p.port.to_string(),
            ));
        }
        let host = match s.cluster_ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("[{}]", s.cluster_ip),
            _ => s.cluster_ip.clone(),
        };
        for (i, p) in s.ports.iter().enumerate() {
            let proto = p.protocol.to_lowercase();
            let url = format!("{proto}://{host}:{}", p.port);
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, p.protocol.to_uppercase());
            out.push((pp.clone(), url));
            out.push((format!("{pp}_PROTO"), proto));
            out.push((format!("{pp}_PORT"), p.port.to_string()));
            out.push((format!("{pp}_ADDR"), s.cluster_ip.clone()));
        }
    }
    out
}

/// The service variables of a pod in `namespace` (upstream's getServiceEnvVarMap): the
/// `kubernetes` Service of `default` always, every Service of `namespace` when
/// `enable_links`. A Service of the pod's namespace named like a master service wins.
pub fn service_env(
    services: &[ServiceInfo],
    namespace: &str,
    enable_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: HashMap<&str, &ServiceInfo> = HashMap::new();
    for s in services.iter().filter(|s| s.has_ip()) {
        if s.namespace == "default" && MASTER_SERVICES.contains(&s.name.as_str()) {
            chosen.entry(s.name.as_str()).or_insert(s);
        } else if s.namespace == namespace && enable_links {
            chosen.insert(s.name.as_str(), s);
        }
    }
    let mut mapped: Vec<ServiceInfo> = chosen.into_values().cloned().collect();
    mapped.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    from_services(&mapped).into_iter().collect()
}

/// [`service_env`] over the informer's store; an error until the first list arrived
/// (upstream refuses to build env for API pods then, so no variable goes missing).
pub fn pod_service_env(
    store: &ServiceStore,
    namespace: &str,
    enable_links: bool,
) -> Result<BTreeMap<String, String>, NotSynced> {
    if !store.has_synced() {
        return Err(NotSynced);
    }
    let all: Vec<ServiceInfo> = store.list().into_iter().map(|(_, s)| s).collect();
    Ok(service_env(&all, namespace, enable_links))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> ServiceInfo {
        ServiceInfo {
            namespace: ns.into(),
            name: name.into(),
            cluster_ip: ip.into(),
            ports: ports
                .iter()
                .map(|(n, p, proto)| ServicePort {
                    name: n.to_string(),
                    port: *p,
                    protocol: proto.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn variables_as_upstream_names_them() {
        let env = service_env(
            &[svc(
                "ns",
                "my-svc",
                "10.96.0.20",
                &[("http", 80, "TCP"), ("dns", 53, "UDP")],
            )],
            "ns",
            true,
        );
        let want: BTreeMap<String, String> = [
            ("MY_SVC_SERVICE_HOST", "10.96.0.20"),
            ("MY_SVC_SERVICE_PORT", "80"),
            ("MY_SVC_SERVICE_PORT_HTTP", "80"),
            ("MY_SVC_SERVICE_PORT_DNS", "53"),
            ("MY_SVC_PORT", "tcp://10.96.0.20:80"),
            ("MY_SVC_PORT_80_TCP", "tcp://10.96.0.20:80"),
            ("MY_SVC_PORT_80_TCP_PROTO", "tcp"),
            ("MY_SVC_PORT_80_TCP_PORT", "80"),
            ("MY_SVC_PORT_80_TCP_ADDR", "10.96.0.20"),
            ("MY_SVC_PORT_53_UDP", "udp://10.96.0.20:53"),
            ("MY_SVC_PORT_53_UDP_PROTO", "udp"),
            ("MY_SVC_PORT_53_UDP_PORT", "53"),
            ("MY_SVC_PORT_53_UDP_ADDR", "10.96.0.20"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(env, want);
    }

    #[test]
    fn namespace_links_and_master_services() {
        let all = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[("https", 443, "TCP")],
            ),
            svc("default", "other", "10.96.0.9", &[("", 80, "TCP")]),
            svc("ns", "web", "10.96.0.10", &[("", 8080, "TCP")]),
            svc("ns", "headless", "None", &[("", 80, "TCP")]),
            svc("ns", "pending", "", &[("", 80, "TCP")]),
            svc("ns2", "elsewhere", "10.96.0.11", &[("", 80, "TCP")]),
        ];
        let env = service_env(&all, "ns", true);
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT_HTTPS"], "443");
        assert_eq!(env["WEB_SERVICE_PORT"], "8080");
        assert_eq!(env["WEB_PORT_8080_TCP_ADDR"], "10.96.0.10");
        for gone in ["OTHER_", "HEADLESS_", "PENDING_", "ELSEWHERE_"] {
            assert!(
                !env.keys().any(|k| k.starts_with(gone)),
                "{gone} must not appear: {env:?}"
            );
        }
        // enableServiceLinks: false keeps only the master service.
        let env = service_env(&all, "ns", false);
        assert!(env.contains_key("KUBERNETES_SERVICE_HOST"));
        assert!(!env.keys().any(|k| k.starts_with("WEB_")));
        // A pod in default sees its namespace's services too.
        assert!(service_env(&all, "default", true).contains_key("OTHER_SERVICE_HOST"));
        // A "kubernetes" Service of the pod's namespace replaces default's.
        let mut shadow = all.to_vec();
        shadow.push(svc("ns", "kubernetes", "10.96.0.99", &[("", 1, "TCP")]));
        assert_eq!(
            service_env(&shadow, "ns", true)["KUBERNETES_SERVICE_HOST"],
            "10.96.0.99"
        );
    }

    #[test]
    fn unsynced_store_is_an_error() {
        let store = ServiceStore::default();
        assert_eq!(pod_service_env(&store, "ns", true), Err(NotSynced));
        store.replace(HashMap::new());
        assert_eq!(pod_service_env(&store, "ns", true), Ok(BTreeMap::new()));
    }
}
