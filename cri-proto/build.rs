//! Compiles the protos with protox (no protoc needed) into prost messages plus tonic clients
//! and servers: the CRI (`proto/runtime/v1/api.proto`), the kubelet's plugin registration API
//! (`proto/pluginregistration/v1/api.proto`) and the CSI Identity and Node services
//! (`proto/csi/v1/csi.proto`).

include!("deviceplugin_build.rs");
include!("dra_build.rs");
include!("podresources_build.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/runtime/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/csi/v1/csi.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Unimplemented RPCs answer UNIMPLEMENTED, so fakes only write what they need.
        .generate_default_stubs(true)
        // Hand-written Debug that hides the secrets (upstream marks them debug_redact).
        // (and CSI requests carrying `secrets`, which the spec marks csi_secret).
        .skip_debug([
            "runtime.v1.AuthConfig",
            "csi.v1.NodeStageVolumeRequest",
            "csi.v1.NodePublishVolumeRequest",
            "csi.v1.NodeExpandVolumeRequest",
        ])
        .compile_fds(fds)?;
    compile_deviceplugin()?;
    compile_dra()?;
    compile_podresources()?;
    Ok(())
}
