// Included by build.rs: compiles the device plugin API (v1beta1) into `deviceplugin.v1beta1`
// of this crate, clients and servers both (the kubelet serves Registration and dials the
// plugins; the test plugin does the reverse).
fn compile_deviceplugin() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=deviceplugin_build.rs");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
