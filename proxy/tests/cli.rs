//! The kube-proxy binary's command line: upstream's flags accepted, flag errors exit 1 as
//! upstream's (cobra) do, `--write-config-to` writes the defaults and exits.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(args)
        .output()
        .expect("run kube-proxy")
}

#[test]
fn flag_errors_exit_1() {
    for args in [
        &["--no-such-flag"][..],
        &["--cleanup=maybe"],
        &["--healthz-port=abc"],
        &["--feature-gates=Foo=perhaps"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
    assert_eq!(run(&["--help"]).status.code(), Some(0));
}

#[test]
fn upstream_only_flags_are_accepted() {
    // --version exits after the parse: every flag here must be known to the parser.
    let out = run(&[
        "--healthz-port=10256",
        "--metrics-port=10249",
        "--vmodule=foo=2",
        "--log-flush-frequency=5s",
        "--log-text-split-stream",
        "--log-text-info-buffer-size=1Mi",
        "--log-json-split-stream=false",
        "--log-json-info-buffer-size=0",
        "--show-hidden-metrics-for-version=1.35",
        "--boot-id-file=/proc/sys/kernel/random/boot_id",
        "--machine-id-file=/etc/machine-id",
        "--init-only=false",
        "--cleanup=0",
        "--version",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Kubernetes v"));
}

#[test]
fn write_config_to_writes_the_defaults_and_exits() {
    let dir = std::env::temp_dir().join(format!("kube-proxy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.yaml");
    let out = run(&[&format!("--write-config-to={}", path.display())]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("kind: KubeProxyConfiguration"), "{text}");
    assert!(text.contains("healthzBindAddress: 0.0.0.0:10256"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Feature gates as upstream's kube-proxy: an unknown gate, or a locked one set against its
/// lock, exits 1 with upstream's message; a known gate passes (the start then stops at the
/// bad proxy mode, checked after the gates).
#[test]
fn unknown_and_locked_feature_gates_exit_1_known_ones_pass() {
    let stderr = |args: &[&str]| {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        err
    };
    let err = stderr(&["--feature-gates=NoSuchGate=true", "--proxy-mode=bogus"]);
    assert!(
        err.contains("failed complete: unrecognized feature gate: NoSuchGate"),
        "{err}"
    );
    let err = stderr(&[
        "--feature-gates=NFTablesProxyMode=false",
        "--proxy-mode=bogus",
    ]);
    assert!(
        err.contains(
            "cannot set feature gate NFTablesProxyMode to false, feature is locked to true"
        ),
        "{err}"
    );
    let err = stderr(&[
        "--feature-gates=NFTablesProxyMode=T,ContextualLogging=1,AllBeta=f",
        "--proxy-mode=bogus",
    ]);
    assert!(!err.contains("feature gate"), "{err}");
    assert!(err.contains("bogus"), "{err}");
}
