// Included by build.rs: compiles the pod resources API (v1, and the deprecated v1alpha1) into
// `podresources::{v1, v1alpha1}` of this crate, server (the kubelet) and client (monitoring
// agents, the e2e tests) both.
fn compile_podresources() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/podresources/v1/api.proto",
        "proto/podresources/v1alpha1/api.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=podresources_build.rs");
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
