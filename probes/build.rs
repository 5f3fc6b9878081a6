//! Compiles `proto/health.proto` with protox (pure Rust, no protoc binary needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/health.proto");
    let fds = protox::compile(["proto/health.proto"], ["proto"])?;
    // The server half is only used by tests (a fake health server), but generating it costs little.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
