// Included by build.rs: compiles the pod resources API (v1) into `podresources::v1` of this
// crate, server (the kubelet) and client (monitoring agents, the e2e tests) both.
fn compile_podresources() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/podresources/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=podresources_build.rs");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
