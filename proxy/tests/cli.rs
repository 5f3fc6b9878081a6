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

/// `--init-only` logs one line and exits 0: enough to see the format.
fn init_only(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--init-only", "--hostname-override=node-a"])
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run kube-proxy")
}

#[test]
fn logging_format_json_writes_component_base_lines() {
    let out = init_only(&["--logging-format=json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("--init-only"))
        .unwrap_or_else(|| panic!("no --init-only line:\n{stderr}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(v["ts"].is_f64(), "{line}");
    assert_eq!(v["v"], 0, "{line}");
    assert!(
        v["msg"].as_str().unwrap().starts_with("--init-only"),
        "{line}"
    );
    assert!(
        regex::Regex::new(r"^[^:]+\.rs:\d+$")
            .unwrap()
            .is_match(v["caller"].as_str().unwrap()),
        "{line}"
    );
}

#[test]
fn klog_text_is_the_default_and_a_config_file_chooses_json() {
    let out = init_only(&[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let header =
        regex::Regex::new(r"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}\s+\d+ [^:]+:\d+\] ").unwrap();
    assert!(!stderr.is_empty());
    for l in stderr.lines() {
        assert!(header.is_match(l), "not a klog line: {l}");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  format: json\n",
    )
    .unwrap();
    let out = init_only(&[&format!("--config={}", config.display())]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for l in stderr.lines() {
        assert!(serde_json::from_str::<serde_json::Value>(l).is_ok(), "{l}");
    }
    // The flag wins over the file.
    let flag = format!("--config={}", config.display());
    let out = init_only(&[&flag, "--logging-format=text"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().all(|l| header.is_match(l)), "{stderr}");
}

#[test]
fn an_unknown_logging_format_is_refused() {
    let out = init_only(&["--logging-format=xml"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("logging.format: Invalid value: \"xml\": Unsupported log format"),
        "{stderr}"
    );
}
