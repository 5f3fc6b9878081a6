//! Fixtures every backend's tests use (Services, EndpointSlices, the state of upstream's
//! overall test, golden files in `proxy/tests/golden/`, regenerated with
//! `UPDATE_GOLDEN=1`), and tests of the shared model.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec,
    ServiceStatus, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::{IpFamily, SERVICE_NAME_LABEL, ServiceState};
use crate::render_config::RenderConfig;

pub(crate) const NODE: &str = "node1";

pub(crate) fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

pub(crate) fn port(name: &str, proto: &str, port: i32, node_port: Option<i32>) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        protocol: Some(proto.into()),
        port,
        node_port,
        ..Default::default()
    }
}

pub(crate) fn svc(ns: &str, name: &str, ty: &str, ip: &str, ports: Vec<ServicePort>) -> Service {
    Service {
        metadata: meta(ns, name),
        spec: Some(ServiceSpec {
            type_: Some(ty.into()),
            cluster_ip: Some(ip.into()),
            cluster_ips: Some(vec![ip.into()]),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) struct Ep<'a> {
    pub(crate) ip: &'a str,
    pub(crate) node: &'a str,
    pub(crate) ready: bool,
    pub(crate) terminating: bool,
}

pub(crate) fn ep<'a>(ip: &'a str, node: &'a str) -> Ep<'a> {
    Ep {
        ip,
        node,
        ready: true,
        terminating: false,
    }
}

pub(crate) fn slice(
    ns: &str,
    svc: &str,
    name: &str,
    ports: &[(&str, &str, i32)],
    eps: &[Ep],
) -> EndpointSlice {
    let mut m = meta(ns, name);
    m.labels = Some(BTreeMap::from([(
        SERVICE_NAME_LABEL.to_string(),
        svc.to_string(),
    )]));
    EndpointSlice {
        metadata: m,
        address_type: "IPv4".into(),
        endpoints: Some(
            eps.iter()
                .map(|e| Endpoint {
                    addresses: vec![e.ip.into()],
                    node_name: Some(e.node.into()),
                    conditions: Some(EndpointConditions {
                        ready: Some(e.ready),
                        serving: Some(e.ready || e.terminating),
                        terminating: Some(e.terminating),
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
        ports: Some(
            ports
                .iter()
                .map(|(n, p, num)| EndpointPort {
                    name: Some((*n).into()),
                    protocol: Some((*p).into()),
                    port: Some(*num),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// Five services covering ClusterIP, LB with ETP Local + source ranges + external IP,
/// NodePort with ClientIP affinity, no endpoints, and UDP with a terminating endpoint.
pub(crate) fn fixture() -> (Vec<Service>, Vec<EndpointSlice>) {
    let svc1 = svc(
        "ns1",
        "svc1",
        "ClusterIP",
        "172.30.0.41",
        vec![port("p80", "TCP", 80, None)],
    );

    let mut svc2 = svc(
        "ns2",
        "svc2",
        "LoadBalancer",
        "172.30.0.42",
        vec![port("p80", "TCP", 80, Some(3001))],
    );
    {
        let spec = svc2.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(30000);
        spec.external_ips = Some(vec!["192.168.99.22".into()]);
        spec.load_balancer_source_ranges = Some(vec!["203.0.113.0/25".into()]);
        svc2.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("1.2.3.4".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
    }

    let mut svc3 = svc(
        "ns3",
        "svc3",
        "NodePort",
        "172.30.0.43",
        vec![port("p80", "TCP", 80, Some(3003))],
    );
    {
        let spec = svc3.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(600),
            }),
        });
    }

    let svc4 = svc(
        "ns4",
        "svc4",
        "ClusterIP",
        "172.30.0.44",
        vec![port("p80", "TCP", 80, None)],
    );
    let svc5 = svc(
        "ns5",
        "dns",
        "ClusterIP",
        "172.30.0.10",
        vec![port("dns", "UDP", 53, None)],
    );

    let slices = vec![
        slice(
            "ns1",
            "svc1",
            "svc1-a",
            &[("p80", "TCP", 80)],
            &[ep("10.180.0.1", "node2")],
        ),
        slice(
            "ns2",
            "svc2",
            "svc2-a",
            &[("p80", "TCP", 80)],
            &[ep("10.180.0.2", "node2"), ep("10.180.0.22", NODE)],
        ),
        slice(
            "ns3",
            "svc3",
            "svc3-a",
            &[("p80", "TCP", 8080)],
            &[ep("10.180.0.3", NODE), ep("10.180.0.4", "node2")],
        ),
        slice(
            "ns5",
            "dns",
            "dns-a",
            &[("dns", "UDP", 5353)],
            &[
                ep("10.180.1.1", "node2"),
                ep("10.180.1.2", "node3"),
                Ep {
                    ip: "10.180.1.3",
                    node: NODE,
                    ready: false,
                    terminating: true,
                },
            ],
        ),
        slice(
            "ns5",
            "dns",
            "dns-b",
            &[("dns", "UDP", 5353)],
            &[ep("10.180.1.4", NODE)],
        ),
    ];
    (vec![svc1, svc2, svc3, svc4, svc5], slices)
}

pub(crate) fn render_cfg() -> RenderConfig {
    let mut cfg = RenderConfig::new(IpFamily::V4, NODE);
    cfg.node_ips = vec!["192.168.0.2".parse().unwrap()];
    cfg.cluster_cidr = Some("10.0.0.0/8".parse().unwrap());
    cfg
}

pub(crate) fn loaded_state() -> ServiceState {
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    let (svcs, slices) = fixture();
    for s in &svcs {
        assert!(st.upsert_service(s));
    }
    for s in &slices {
        assert!(st.upsert_endpoint_slice(s));
    }
    st
}

pub(crate) fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(actual, expected, "golden file {} differs", path.display());
}

/// Changes applied on top of the fixture for the partial-sync golden: one endpoint more for
/// svc1, svc3 deleted, a new svc6.
pub(crate) fn apply_changes(st: &mut ServiceState) {
    assert!(st.upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.1", "node2"), ep("10.180.0.5", NODE)],
    )));
    assert!(st.delete_service("ns3", "svc3"));
    assert!(st.upsert_service(&svc(
        "ns6",
        "svc6",
        "ClusterIP",
        "172.30.0.46",
        vec![port("", "TCP", 443, None)]
    )));
    assert!(st.upsert_endpoint_slice(&slice(
        "ns6",
        "svc6",
        "svc6-a",
        &[("", "TCP", 8443)],
        &[ep("10.180.0.6", "node2")]
    )));
}

#[test]
fn endpoint_merging_and_categorizing() {
    let st = loaded_state();
    let eps = st.endpoints_map();
    let dns = eps.iter().find(|(k, _)| k.service.name == "dns").unwrap().1;
    let ips: Vec<String> = dns.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        ips,
        [
            "10.180.1.1:5353",
            "10.180.1.2:5353",
            "10.180.1.3:5353",
            "10.180.1.4:5353"
        ]
    );
    assert!(dns[2].terminating && !dns[2].ready && dns[2].is_local);
    let svc3 = st
        .service_port_map()
        .values()
        .find(|p| p.name.service.name == "svc3")
        .unwrap();
    assert_eq!(svc3.session_affinity_seconds, Some(600));
    // Re-applying the same object is not a change.
    let (svcs, slices) = fixture();
    let mut st = st;
    st.take_changes();
    assert!(!st.upsert_service(&svcs[0]));
    assert!(!st.upsert_endpoint_slice(&slices[0]));
    assert!(!st.has_changes());
}

#[test]
fn dns_labels() {
    use crate::model::is_dns_label;
    for ok in ["a", "web-1", "0x", &"a".repeat(63)] {
        assert!(is_dns_label(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a.b", "a\"", "a\nb", &"a".repeat(64)] {
        assert!(!is_dns_label(bad), "{bad:?}");
    }
}
