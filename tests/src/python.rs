//! grpc-python for the e2e tests: the venv `tests/rig/rig.sh install` fills with grpcio and
//! grpcio-tools from PyPI, and stubs generated from the project's `.proto` files.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv's interpreter, or why the tests that need it skip.
pub fn grpc_python() -> Result<PathBuf, String> {
    let venv = std::env::var_os("RIG_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("RIG_HOME").unwrap_or("/var/tmp/node-rig".into());
            Path::new(&home).join("pyvenv")
        });
    let py = venv.join("bin/python3");
    let ok = Command::new(&py)
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "grpcio and grpcio-tools are not installed in {}: run `tests/rig/rig.sh install` \
             (it installs them from PyPI)",
            venv.display()
        ))
    }
}

/// Generates Python messages and gRPC stubs for `protos` (paths under `cri-proto/proto`)
/// into `out`, importable as `deviceplugin.v1beta1.api_pb2` and so on.
pub fn generate_stubs(py: &Path, out: &Path, protos: &[&str]) {
    let include = crate::repo_root().join("cri-proto/proto");
    let res = Command::new("timeout")
        .arg("120")
        .arg(py)
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .args(protos)
        .output()
        .expect("run grpc_tools.protoc");
    assert!(
        res.status.success(),
        "grpc_tools.protoc failed:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
}
