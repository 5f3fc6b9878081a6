//! The kubelet's registry of every flag and KubeletConfiguration field it accepts, with what
//! each does here (see `plumbing::settings` for the rule and the shared machinery), and the
//! start-time host checks upstream makes for some of them (`protectKernelDefaults`,
//! `failSwapOn`).
//!
//! `docs/settings.md` is generated from these registries and kube-proxy's; the `settings_doc`
//! test fails when it is stale (`UPDATE_SETTINGS_DOC=1 cargo test -p kubelet settings_doc`
//! rewrites it).

use plumbing::settings::s;
pub use plumbing::settings::{Findings, Setting, Status};

const NO_QOS_RESERVED: &str = "the QoS tiers get no memory reservation (upstream's alpha QOSReserved gate); only their cpu shares are written.";
const NO_CM: &str = "there is no CPU/memory/topology manager.";

pub mod cli;
mod error;
mod fields;
pub mod file;
mod flags;
#[cfg(test)]
mod readme;
pub mod resolve;

pub use cli::Flags;
pub use error::ConfigError;
pub use fields::FIELDS;
pub use file::{KubeletConfiguration, parse_file};
pub use flags::FLAGS;

/// Warnings and refusals for the kubelet's flags (`(long name, raw value)` as given on the
/// command line) and its config file text.
pub fn check(given: &[(String, String)], file_text: Option<&str>) -> Findings {
    let mut out = plumbing::settings::check_flags(FLAGS, given);
    if let Some(t) = file_text {
        out.extend(plumbing::settings::check_file(
            FIELDS,
            "KubeletConfiguration v1beta1",
            t,
        ));
    }
    out
}

/// Upstream's expected kernel tunables (pkg/kubelet/cm setupKernelTunables): with
/// `protectKernelDefaults` the start fails when one differs.
pub const KERNEL_TUNABLES: &[(&str, i64)] = &[
    ("vm/overcommit_memory", 1),
    ("vm/panic_on_oom", 0),
    ("kernel/panic", 10),
    ("kernel/panic_on_oops", 1),
    ("kernel/keys/root_maxkeys", 1000000),
    ("kernel/keys/root_maxbytes", 25000000),
];

/// The tunables that differ (or cannot be read), in upstream's words; `read` gets a path
/// below /proc/sys.
pub fn kernel_tunable_problems(read: impl Fn(&str) -> Option<String>) -> Vec<String> {
    KERNEL_TUNABLES
        .iter()
        .filter_map(
            |(flag, want)| match read(flag).and_then(|t| t.trim().parse::<i64>().ok()) {
                Some(v) if v == *want => None,
                Some(v) => Some(format!(
                    "invalid kernel flag: {flag}, expected value: {want}, actual value: {v}"
                )),
                None => Some(format!("reading kernel flag {flag}: not readable")),
            },
        )
        .collect()
}

/// Whether /proc/swaps lists an active swap device (any line after the header).
pub fn swap_on(proc_swaps: &str) -> bool {
    proc_swaps.lines().skip(1).any(|l| !l.trim().is_empty())
}

/// Host checks upstream makes at start for `protectKernelDefaults` and `failSwapOn`. Reads
/// /proc only; never writes.
pub fn preflight(protect_kernel_defaults: bool, fail_swap_on: bool) -> Result<(), String> {
    if protect_kernel_defaults {
        let problems = kernel_tunable_problems(|p| {
            std::fs::read_to_string(std::path::Path::new("/proc/sys").join(p)).ok()
        });
        if !problems.is_empty() {
            return Err(format!("protectKernelDefaults: [{}]", problems.join(", ")));
        }
    }
    if fail_swap_on
        && std::fs::read_to_string("/proc/swaps")
            .map(|t| swap_on(&t))
            .unwrap_or(false)
    {
        return Err(
            "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false"
                .into(),
        );
    }
    Ok(())
}

/// `docs/settings.md`, generated from the registries of both binaries.
pub fn settings_doc() -> String {
    let mut s = String::from(
        "# Settings\n\n\
         <!-- Generated from kubelet/src/settings.rs and proxy/src/settings.rs; do not edit.\n\
         Regenerate: UPDATE_SETTINGS_DOC=1 cargo test -p kubelet settings_doc -->\n\n\
         Every flag and config field the agent accepts, and what it does with it. No setting is\n\
         accepted and silently ignored:\n\n\
         - **Implemented**: works as upstream's (the note says where it differs in detail).\n\
         - **NotImplemented**: accepted, has no effect; one warning naming it is logged at start\n  \
         when it is set to a value other than the listed ones (upstream's default, or values whose\n  \
         behaviour the agent provides). Absent, `null`, empty values are never \"set\".\n\
         - **Refused**: security-relevant and not provided; the agent refuses to start when it is\n  \
         set to a value other than the listed ones.\n\n\
         Config fields the agent does not know are named in a warning at start.\n\n\
         The kubelet API (:10250) authenticates every request as upstream does: x509 client\n\
         certificates against `clientCAFile`, bearer tokens through TokenReview (webhook\n\
         authentication), anonymous only with `authentication.anonymous.enabled: true`; and\n\
         authorizes it through SubjectAccessReview (Webhook authorization) or AlwaysAllow.\n\
         Standalone (no kubeconfig), webhook authentication or authorization refuses to start, as\n\
         upstream.\n\n",
    );
    s.push_str("## kubelet flags\n\n");
    s.push_str(&plumbing::settings::markdown_table(FLAGS));
    s.push_str("\n## KubeletConfiguration (kubelet.config.k8s.io/v1beta1)\n\n");
    s.push_str(&plumbing::settings::markdown_table(FIELDS));
    s.push_str("\n## kube-proxy flags\n\n");
    s.push_str(&plumbing::settings::markdown_table(proxy::settings::FLAGS));
    s.push_str("\n## KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1)\n\n");
    s.push_str(&plumbing::settings::markdown_table(proxy::settings::FIELDS));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn given(args: &[&str]) -> Vec<(String, String)> {
        let cmd = crate::settings::cli::Flags::command();
        let m = cmd
            .clone()
            .try_get_matches_from(std::iter::once("kubelet").chain(args.iter().copied()))
            .unwrap();
        plumbing::settings::given_flags(&cmd, &m)
    }

    #[test]
    fn settings_doc() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/settings.md");
        let want = super::settings_doc();
        if std::env::var_os("UPDATE_SETTINGS_DOC").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let first = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(have.lines().count().min(want.lines().count()));
            panic!(
                "docs/settings.md is stale (first difference at line {}: have {:?}, want {:?}).\n\
                 Regenerate it: UPDATE_SETTINGS_DOC=1 cargo test -p kubelet settings_doc",
                first + 1,
                have.lines().nth(first),
                want.lines().nth(first)
            );
        }
    }

    #[test]
    fn every_flag_entry_is_a_real_flag_and_every_flag_has_an_entry() {
        let cmd = crate::settings::cli::Flags::command();
        let longs: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| l != "--help")
            .collect();
        for e in FLAGS {
            assert!(
                longs.contains(&e.name.to_string()),
                "{} is not a flag",
                e.name
            );
        }
        for l in &longs {
            assert!(FLAGS.iter().any(|e| e.name == l), "flag {l} has no entry");
        }
        let mut names: Vec<_> = FLAGS.iter().map(|e| e.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FLAGS.len(), "duplicate entries");
    }

    #[test]
    fn every_field_entry_is_known_to_serde() {
        for e in FIELDS {
            let top = e.name.split('.').next().unwrap();
            if matches!(top, "apiVersion" | "kind") {
                continue;
            }
            let cfg = crate::config::parse_file("t", &format!("{top}: null\n")).unwrap();
            assert!(
                !cfg.extra.contains_key(top),
                "{} is in the registry but KubeletConfiguration does not declare it",
                e.name
            );
        }
        // And every declared field has an entry (serialization lists the declared names).
        let declared =
            serde_json::to_value(crate::config::KubeletConfiguration::default()).unwrap();
        for k in declared.as_object().unwrap().keys() {
            assert!(
                FIELDS
                    .iter()
                    .any(|e| e.name == k || e.name.starts_with(&format!("{k}."))),
                "declared field {k} has no registry entry"
            );
        }
        let mut names: Vec<_> = FIELDS.iter().map(|e| e.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len(), "duplicate entries");
    }

    #[test]
    fn qos_reserved_and_unknown_field_warn_exactly() {
        let f = check(
            &[],
            Some("kind: KubeletConfiguration\nqosReserved: {memory: 50%}\nfooBar: 1\n"),
        );
        let mut warnings = f.warnings.clone();
        warnings.sort();
        assert_eq!(
            warnings,
            vec![
                format!("field qosReserved is set to {{\"memory\":\"50%\"}} but has no effect in this agent: {NO_QOS_RESERVED}"),
                "unknown field \"fooBar\": not a KubeletConfiguration v1beta1 field this agent knows; ignored".to_string(),
            ]
        );
        assert!(f.refusals.is_empty());
    }

    #[test]
    fn defaults_are_not_set() {
        let text = "kind: KubeletConfiguration\nevictionPressureTransitionPeriod: 5m0s\n\
                    imageGCHighThresholdPercent: 85\nimageGCLowThresholdPercent: 80\n\
                    imageMinimumGCAge: 2m0s\nserializeImagePulls: true\nreadOnlyPort: 0\n\
                    enforceNodeAllocatable: [pods]\ncontainerLogMaxSize: 10Mi\nkubeReserved: {}\n\
                    cpuManagerPolicy: none\nseccompDefault: false\nlogging: {format: text, flushFrequency: 5s}\n";
        assert_eq!(check(&[], Some(text)), Findings::default());
        assert_eq!(
            check(
                &given(&[
                    "--serialize-image-pulls",
                    "--read-only-port=0",
                    "--image-gc-high-threshold=85"
                ]),
                None
            ),
            Findings::default()
        );
    }

    #[test]
    fn flags_warn_or_refuse() {
        let f = check(
            &given(&[
                "--eviction-hard=memory.available<100Mi",
                "--enforce-node-allocatable=pods,kube-reserved",
                "--fail-swap-on=false",
                "--serialize-image-pulls=false",
                "--hairpin-mode=hairpin-veth",
                "--max-pods=10",
            ]),
            None,
        );
        // The eviction manager, node allocatable and parallel pulls make those work: not
        // warned; the hairpin mode is left to the CNI plugin: warned.
        assert_eq!(f.warnings.len(), 1, "{f:#?}");
        assert!(!f.warnings.iter().any(|w| w.contains("--eviction-hard")));
        assert!(f.warnings[0].contains("--hairpin-mode"), "{f:#?}");
        let f = check(
            &given(&["--read-only-port=10255", "--seccomp-default"]),
            None,
        );
        // Both work: neither refused nor warned.
        assert!(f.refusals.is_empty(), "{f:#?}");
        assert!(f.warnings.is_empty(), "{f:#?}");
    }

    #[test]
    fn read_only_port_and_max_open_files_are_accepted() {
        let f = check(&[], Some("readOnlyPort: 10255\nmaxOpenFiles: 4096\n"));
        assert!(f.refusals.is_empty(), "{f:#?}");
        assert!(f.warnings.is_empty(), "{f:#?}");
    }

    #[test]
    fn kubeadm_config_is_fully_supported() {
        // kubeadm's authentication/authorization (client CA, webhook, caches) all work.
        let f = check(&[], Some(crate::config::tests::KUBEADM_CONFIG));
        assert_eq!(f, Findings::default(), "{f:#?}");
        // kubeadm's command line: only flags that work.
        let g = given(&[
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--config=/var/lib/kubelet/config.yaml",
            "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
            "--node-ip=10.0.0.5",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
        ]);
        assert_eq!(check(&g, None), Findings::default());
    }

    #[test]
    fn kernel_tunables_checked_as_upstream() {
        let good = |p: &str| {
            KERNEL_TUNABLES
                .iter()
                .find(|(f, _)| *f == p)
                .map(|(_, v)| format!("{v}\n"))
        };
        assert!(kernel_tunable_problems(good).is_empty());
        let bad = |p: &str| match p {
            "kernel/panic" => Some("0\n".to_string()),
            other => good(other),
        };
        assert_eq!(
            kernel_tunable_problems(bad),
            vec!["invalid kernel flag: kernel/panic, expected value: 10, actual value: 0"]
        );
        assert!(swap_on(
            "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1 0 -2\n"
        ));
        assert!(!swap_on("Filename\tType\tSize\tUsed\tPriority\n"));
    }
}
