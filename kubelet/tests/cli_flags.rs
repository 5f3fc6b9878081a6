//! The kubelet binary's command line: upstream's flags that reach real command lines through
//! `KUBELET_EXTRA_ARGS` (resource managers, cAdvisor and logging flags, …) start the agent
//! instead of stopping it with "unexpected argument"; bad values exit 1 as upstream's.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubelet"))
        .args(args)
        .output()
        .expect("run kubelet")
}

#[test]
fn upstream_flags_from_extra_args_are_accepted() {
    // --version exits right after the parse: every flag here must be known to the parser.
    let out = run(&[
        "--rotate-server-certificates",
        "--cpu-manager-policy=static",
        "--topology-manager-policy=single-numa-node",
        "--reserved-memory=0:memory=1Gi",
        "--system-cgroups=/system.slice",
        "--volume-stats-agg-period=1m",
        "--make-iptables-util-chains=true",
        "--enable-server=1",
        "--fail-cgroupv1=false",
        "--housekeeping-interval=10s",
        "--storage-driver-db=cadvisor",
        "--containerd=/run/containerd/containerd.sock",
        "--boot-id-file=/proc/sys/kernel/random/boot_id",
        "--log-text-split-stream",
        "--log-json-info-buffer-size=0",
        "--feature-gates=KubeletPSI=t",
        "--version",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Kubernetes v"));
}

#[test]
fn bad_values_exit_1() {
    for args in [
        &["--housekeeping-interval=often", "--version"][..],
        &["--enable-server=maybe", "--version"],
        &["--feature-gates=KubeletPSI=perhaps", "--version"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
}

/// Feature gates as upstream's kubelet: an unknown gate, or a locked gate set against its
/// lock, stops the start with upstream's message and exit 1; a known gate (Go's boolean
/// spellings) passes the gate check (the start then stops at the config file's bad
/// cgroupDriver, after it).
#[test]
fn unknown_and_locked_feature_gates_are_refused_known_ones_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: upstart\n",
    )
    .unwrap();
    let config_flag = format!("--config={}", config.display());
    let stderr = |args: &[&str]| {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        err
    };
    let err = stderr(&["--feature-gates=KubeletPSI=true,NoSuchGate=T", &config_flag]);
    assert!(
        err.contains("unrecognized feature gate: NoSuchGate"),
        "{err}"
    );
    let err = stderr(&["--feature-gates=InPlacePodVerticalScaling=0", &config_flag]);
    assert!(
        err.contains(
            "cannot set feature gate InPlacePodVerticalScaling to false, feature is locked to true"
        ),
        "{err}"
    );
    let err = stderr(&[
        "--feature-gates=KubeletPSI=F,ContextualLogging=1,AllAlpha=false",
        &config_flag,
    ]);
    assert!(!err.contains("feature gate"), "{err}");
    assert!(err.contains("upstart"), "{err}");
}
