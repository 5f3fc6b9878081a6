//! The pod resources API v1 (upstream's `k8s.io/kubelet/pkg/apis/podresources/v1`): the
//! `PodResourcesLister` service the kubelet serves on `<root-dir>/pod-resources/kubelet.sock`
//! for monitoring agents (which devices, CPUs and memory each container holds), plus a
//! client for it.

use std::path::Path;
use std::time::Duration;

/// Generated `v1` types, client and server.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("v1");
}

/// Generated `v1alpha1` types, client and server (deprecated upstream, still served there
/// beside v1: `List` with devices only).
pub mod v1alpha1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("v1alpha1");
}

pub use v1::pod_resources_lister_client::PodResourcesListerClient;

/// The socket directory's name under the root dir.
pub const DIR_NAME: &str = "pod-resources";
/// The socket's name in that directory (upstream's `podresources.Socket` plus `.sock`).
pub const SOCKET: &str = "kubelet.sock";
/// The `server_api_version` label of the endpoint's metrics.
pub const API_VERSION: &str = "v1";
/// The same label for the v1alpha1 service.
pub const API_VERSION_V1ALPHA1: &str = "v1alpha1";
/// Largest message [`client`] accepts (16 MiB, what upstream's clients pass as `maxMsgSize`).
pub const MAX_MSG_SIZE: usize = 16 * 1024 * 1024;

/// A client on the socket at `path` (connection bounded by `timeout`).
pub async fn client(
    path: &Path,
    timeout: Duration,
) -> crate::Result<PodResourcesListerClient<crate::Channel>> {
    let ch = crate::connect(&path.display().to_string(), timeout).await?;
    Ok(PodResourcesListerClient::new(ch).max_decoding_message_size(MAX_MSG_SIZE))
}

#[cfg(test)]
mod tests {
    use super::v1::*;
    use prost::Message;

    #[test]
    fn wire_names_and_numbers_match_upstream() {
        use tonic::server::NamedService;
        struct Nop;
        impl pod_resources_lister_server::PodResourcesLister for Nop {}
        assert_eq!(
            <pod_resources_lister_server::PodResourcesListerServer<Nop> as NamedService>::NAME,
            "v1.PodResourcesLister"
        );
        // ContainerResources: name 1, devices 2, cpu_ids 3 (packed), memory 4, dynamic 5.
        let c = ContainerResources {
            name: "a".into(),
            devices: vec![ContainerDevices {
                resource_name: "r".into(),
                device_ids: vec!["d".into()],
                topology: Some(TopologyInfo {
                    nodes: vec![NumaNode { id: 1 }],
                }),
            }],
            cpu_ids: vec![3],
            memory: vec![ContainerMemory {
                memory_type: "m".into(),
                size: 2,
                topology: None,
            }],
            dynamic_resources: vec![DynamicResource {
                claim_name: "c".into(),
                ..Default::default()
            }],
        };
        assert_eq!(
            c.encode_to_vec(),
            vec![
                0x0a, 1, b'a', // name
                0x12, 12, 0x0a, 1, b'r', 0x12, 1, b'd', 0x1a, 4, 0x0a, 2, 0x08, 1, // devices
                0x1a, 1, 3, // cpu_ids, packed
                0x22, 5, 0x0a, 1, b'm', 0x10, 2, // memory
                0x2a, 3, 0x12, 1, b'c', // dynamic_resources: claim_name is field 2
            ]
        );
        // ClaimResource: cdi_devices 1, driver 2, pool 3, device 4, share_id 5 (optional:
        // an empty share is still sent when set).
        let r = ClaimResource {
            cdi_devices: vec![CdiDevice { name: "x".into() }],
            driver_name: "d".into(),
            pool_name: "p".into(),
            device_name: "n".into(),
            share_id: Some(String::new()),
        };
        assert_eq!(
            r.encode_to_vec(),
            vec![
                0x0a, 3, 0x0a, 1, b'x', 0x12, 1, b'd', 0x1a, 1, b'p', 0x22, 1, b'n', 0x2a, 0
            ]
        );
        let g = GetPodResourcesRequest {
            pod_name: "p".into(),
            pod_namespace: "n".into(),
        };
        assert_eq!(g.encode_to_vec(), vec![0x0a, 1, b'p', 0x12, 1, b'n']);
        let a = AllocatableResourcesResponse {
            cpu_ids: vec![1],
            ..Default::default()
        };
        assert_eq!(a.encode_to_vec(), vec![0x12, 1, 1]);
    }

    #[test]
    fn v1alpha1_wire_names_and_numbers_match_upstream() {
        use super::v1alpha1::*;
        use tonic::server::NamedService;
        struct Nop;
        impl pod_resources_lister_server::PodResourcesLister for Nop {}
        assert_eq!(
            <pod_resources_lister_server::PodResourcesListerServer<Nop> as NamedService>::NAME,
            "v1alpha1.PodResourcesLister"
        );
        let p = PodResources {
            name: "p".into(),
            namespace: "n".into(),
            containers: vec![ContainerResources {
                name: "c".into(),
                devices: vec![ContainerDevices {
                    resource_name: "r".into(),
                    device_ids: vec!["d".into()],
                }],
            }],
        };
        assert_eq!(
            p.encode_to_vec(),
            vec![
                0x0a, 1, b'p', 0x12, 1, b'n', // name, namespace
                0x1a, 11, 0x0a, 1, b'c', // containers: name
                0x12, 6, 0x0a, 1, b'r', 0x12, 1, b'd', // devices
            ]
        );
    }
}
