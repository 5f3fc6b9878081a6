//! The device plugin API v1beta1 (upstream's `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`):
//! messages, the `Registration` service the kubelet serves and the `DevicePlugin` service
//! each plugin serves, plus upstream's constants.

/// Generated `v1beta1` types, clients and servers.
pub mod v1beta1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("v1beta1");
}

/// A device plugin for tests (upstream's sample device plugin's behaviour).
#[cfg(any(test, feature = "test-util"))]
pub mod sample;

/// The API version plugins send in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket's name inside the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// `Device.health` of a usable device.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device that must not be handed out.
pub const UNHEALTHY: &str = "Unhealthy";

#[cfg(test)]
mod tests {
    use super::v1beta1::*;
    use prost::Message;

    #[test]
    fn wire_names_and_numbers_match_upstream() {
        use tonic::server::NamedService;
        struct Nop;
        impl registration_server::Registration for Nop {}
        impl device_plugin_server::DevicePlugin for Nop {}
        assert_eq!(
            <registration_server::RegistrationServer<Nop> as NamedService>::NAME,
            "v1beta1.Registration"
        );
        assert_eq!(
            <device_plugin_server::DevicePluginServer<Nop> as NamedService>::NAME,
            "v1beta1.DevicePlugin"
        );
        // ContainerAllocateResponse.cdi_devices is field 5 (length-delimited): key 0x2a.
        let r = ContainerAllocateResponse {
            cdi_devices: vec![CdiDevice { name: "a".into() }],
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec()[0], 0x2a);
        // RegisterRequest.options is field 4: key 0x22.
        let r = RegisterRequest {
            options: Some(DevicePluginOptions::default()),
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec()[0], 0x22);
        // Device.topology is field 3; NUMANode.ID is field 1 (varint).
        let d = Device {
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
            ..Default::default()
        };
        assert_eq!(d.encode_to_vec(), vec![0x1a, 4, 0x0a, 2, 0x08, 1]);
        let p = ContainerPreferredAllocationRequest {
            allocation_size: 2,
            ..Default::default()
        };
        assert_eq!(p.encode_to_vec(), vec![0x18, 2]);
    }
}
