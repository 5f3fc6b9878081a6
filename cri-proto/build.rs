//! Compiles proto/runtime/v1/api.proto with protox (no protoc needed) into
//! prost messages plus tonic clients and servers.

include!("deviceplugin_build.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Unimplemented RPCs answer UNIMPLEMENTED, so fakes only write what they need.
        .generate_default_stubs(true)
        // Hand-written Debug that hides the secrets (upstream marks them debug_redact).
        .skip_debug(["runtime.v1.AuthConfig"])
        .compile_fds(fds)?;
    compile_deviceplugin()?;
    Ok(())
}
