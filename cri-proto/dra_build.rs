// Included by build.rs: compiles the DRA plugin API (upstream's `k8s.io/kubelet/pkg/apis/dra`,
// versions v1 and v1beta1) into clients and servers (the kubelet dials the plugins; the test
// driver serves).
fn compile_dra() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/dra/v1/api.proto", "proto/dra/v1beta1/api.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=dra_build.rs");
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
