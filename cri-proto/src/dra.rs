//! The DRA kubelet plugin API (upstream's `k8s.io/kubelet/pkg/apis/dra`): `NodePrepareResources`
//! and `NodeUnprepareResources`, served by a DRA driver's kubelet plugin, in the two versions
//! the kubelet of v1.36 speaks. A plugin lists the services it serves, as
//! `<version>.DRAPlugin`, in its registration's supported versions.

/// Generated `k8s.io.kubelet.pkg.apis.dra.v1` types, client and server.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Generated `k8s.io.kubelet.pkg.apis.dra.v1beta1` types, client and server (the same
/// messages as v1).
pub mod v1beta1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// The supported-versions entry of a plugin serving the v1 service.
pub const V1_SERVICE: &str = "v1.DRAPlugin";
/// The supported-versions entry of a plugin serving the v1beta1 service.
pub const V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
/// The services the kubelet can use, most recent first.
pub const SERVICES: [&str; 2] = [V1_SERVICE, V1BETA1_SERVICE];

#[cfg(test)]
mod tests {
    use prost::Message;

    #[test]
    fn wire_names_and_numbers_match_upstream() {
        use tonic::server::NamedService;
        struct Nop;
        impl super::v1::dra_plugin_server::DraPlugin for Nop {}
        impl super::v1beta1::dra_plugin_server::DraPlugin for Nop {}
        assert_eq!(
            <super::v1::dra_plugin_server::DraPluginServer<Nop> as NamedService>::NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        );
        assert_eq!(
            <super::v1beta1::dra_plugin_server::DraPluginServer<Nop> as NamedService>::NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
        );
        use super::v1::*;
        // Claim: namespace 1, uid 2, name 3.
        let c = Claim {
            namespace: "a".into(),
            uid: "b".into(),
            name: "c".into(),
        };
        assert_eq!(
            c.encode_to_vec(),
            vec![0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c']
        );
        // Device: request_names 1, pool_name 2, device_name 3, cdi_device_ids 4.
        let d = Device {
            request_names: vec!["r".into()],
            pool_name: "p".into(),
            device_name: "d".into(),
            cdi_device_ids: vec!["x".into()],
            share_id: None,
        };
        assert_eq!(
            d.encode_to_vec(),
            vec![0x0a, 1, b'r', 0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 1, b'x']
        );
        // NodePrepareResourceResponse: devices 1, error 2.
        let r = NodePrepareResourceResponse {
            devices: vec![],
            error: "e".into(),
        };
        assert_eq!(r.encode_to_vec(), vec![0x12, 1, b'e']);
        // The responses are maps keyed by claim UID at field 1 (key 1 in the entry).
        let r = NodeUnprepareResourcesResponse {
            claims: [("u".to_string(), NodeUnprepareResourceResponse::default())].into(),
        };
        assert_eq!(r.encode_to_vec(), vec![0x0a, 3, 0x0a, 1, b'u']);
    }
}
