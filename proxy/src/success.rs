//! What every proxier (iptables, nftables, ipvs) does once the kernel took a sync, in this
//! order: `/healthz` learns that the family is up to date, the healthCheckNodePort servers
//! follow the services, and the UDP flows to endpoints that went away are deleted.

use crate::conntrack::{self, Conntrack, UdpTarget};
use crate::health::{HealthCheckState, ServiceHealthServer};
use crate::model::IpFamily;
use crate::tracker::ProxyHandle;

/// See the module's text. `hc` is `None` when the proxier serves no health-check ports.
pub(crate) async fn record_success<C: Conntrack>(
    handle: &ProxyHandle,
    family: IpFamily,
    service_health: Option<&ServiceHealthServer>,
    hc: Option<&HealthCheckState>,
    conntrack: &C,
    udp: &[UdpTarget],
) {
    handle.health().updated(family);
    if let (Some(server), Some((ports, counts))) = (service_health, hc) {
        server.sync_services(ports).await;
        server.sync_endpoints(counts);
    }
    conntrack::clean_stale_entries(conntrack, family, udp).await;
}
