use super::*;
use crate::settings::parse_file;
use clap::Parser;

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
}

/// The servers' part of the configuration, as `config::merge` assembles it.
fn merge(
    flags: &Flags,
    file: KubeletConfiguration,
    _hostname: &str,
) -> Result<Settings, ConfigError> {
    resolve(flags, &file)
}

/// The `nodeAgentServer` section of a config file.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct File {
    node_agent_server: Option<FileSettings>,
}

fn parse(text: &str) -> Result<ConnectionLimits, String> {
    let file: File = serde_saphyr::from_str(text).unwrap();
    super::merge(file.node_agent_server.as_ref())
}

#[test]
fn connection_limits_default_and_parse() {
    assert_eq!(parse("{}").unwrap(), ConnectionLimits::default());
    assert_eq!(
        ConnectionLimits::default(),
        ConnectionLimits {
            max_connections: 4096,
            max_connections_per_source: 256,
            authenticated_connection_reserve: 1024,
            max_connections_per_identity: 1024,
        }
    );
    let s = parse(
        "nodeAgentServer:\n  maxConnections: 100\n  maxConnectionsPerSource: 7\n  authenticatedConnectionReserve: 0\n",
    )
    .unwrap();
    assert_eq!(
        (
            s.max_connections,
            s.max_connections_per_source,
            s.authenticated_connection_reserve
        ),
        (100, 7, 0)
    );
    // The reserve follows a configured cap.
    let s = parse("nodeAgentServer:\n  maxConnections: 100\n").unwrap();
    assert_eq!(s.authenticated_connection_reserve, 25);
    let rw = s.limits(ServerType::ReadWrite);
    assert_eq!(
        (
            rw.max_connections,
            rw.max_per_source,
            rw.authenticated_reserve
        ),
        (100, 256, 25)
    );
    assert_eq!(rw.max_per_identity, 25, "a quarter of the cap per identity");
    let s2 = parse("nodeAgentServer:\n  maxConnectionsPerIdentity: 9\n").unwrap();
    assert_eq!(s2.limits(ServerType::ReadWrite).max_per_identity, 9);
    let ro = s.limits(ServerType::ReadOnly);
    assert_eq!((ro.max_per_source, ro.authenticated_reserve), (256, 0));
    let hz = s.limits(ServerType::Healthz);
    assert_eq!(
        (hz.max_per_source, hz.authenticated_reserve),
        (usize::MAX, 0)
    );
}

#[test]
fn bad_connection_limits_are_named() {
    for (text, want) in [
        (
            "nodeAgentServer:\n  maxConnections: 0\n",
            "maxConnections: 0 must be at least 1",
        ),
        (
            "nodeAgentServer:\n  maxConnectionsPerSource: 0\n",
            "maxConnectionsPerSource: 0",
        ),
        (
            "nodeAgentServer:\n  authenticatedConnectionReserve: -1\n",
            "authenticatedConnectionReserve: -1",
        ),
        (
            "nodeAgentServer:\n  maxConnections: 10\n  authenticatedConnectionReserve: 10\n",
            "must be less than maxConnections (10)",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn debug_settings_defaults_and_upstream_validation() {
    let off = |_: &str, d: bool| d;
    let on = |_: &str, _: bool| true;
    let d = debug_settings(None, None, None, true, off).unwrap();
    assert!(d.enable_debug_flags_handler && d.enable_profiling_handler);
    assert!(!d.enable_system_log_query);
    assert!(
        d.statusz && d.flagz,
        "both z-pages are on by default in v1.36"
    );
    let f = serde_json::json!(false);
    let t = serde_json::json!(true);
    let d = debug_settings(Some(&f), Some(&f), None, true, off).unwrap();
    assert!(!d.enable_debug_flags_handler && !d.enable_profiling_handler);
    assert!(
        debug_settings(Some(&serde_json::json!("yes")), None, None, true, off)
            .unwrap_err()
            .starts_with("enableDebugFlagsHandler:")
    );
    // enableSystemLogQuery needs the gate (off by default) and the log handler.
    assert_eq!(
        debug_settings(None, None, Some(&t), true, off).unwrap_err(),
        "invalid configuration: NodeLogQuery feature gate is required for enableSystemLogHandler"
    );
    assert_eq!(
        debug_settings(None, None, Some(&t), false, on).unwrap_err(),
        "invalid configuration: enableSystemLogHandler is required for enableSystemLogQuery"
    );
    assert!(
        debug_settings(None, None, Some(&t), true, on)
            .unwrap()
            .enable_system_log_query
    );
}

#[test]
fn enable_debugging_handlers_is_read() {
    let file = parse_file("c", "enableDebuggingHandlers: false\n").unwrap();
    assert!(
        !merge(&flags(&[]), file, "n")
            .unwrap()
            .enable_debugging_handlers
    );
    let file = parse_file("c", "enableDebuggingHandlers: true\n").unwrap();
    assert!(
        merge(&flags(&[]), file, "n")
            .unwrap()
            .enable_debugging_handlers
    );
}

#[test]
fn auth_defaults_follow_upstream() {
    use crate::server::AuthzMode;
    // No config file: the legacy flag defaults.
    let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
    assert!(cfg.auth.anonymous && !cfg.auth.webhook);
    assert_eq!(cfg.auth.mode, AuthzMode::AlwaysAllow);
    // A config file: v1beta1's defaults.
    let file = parse_file("c", "kind: KubeletConfiguration\n").unwrap();
    let cfg = merge(&flags(&["--config=c"]), file, "n").unwrap();
    assert!(!cfg.auth.anonymous && cfg.auth.webhook);
    assert_eq!(cfg.auth.mode, AuthzMode::Webhook);
    // kubeadm's file, and flags over the file.
    let file = parse_file("c", crate::config::tests::KUBEADM_CONFIG).unwrap();
    let cfg = merge(
        &flags(&[
            "--config=c",
            "--anonymous-auth",
            "--container-runtime-endpoint=unix:///x",
        ]),
        file,
        "n",
    )
    .unwrap();
    assert!(cfg.auth.anonymous && cfg.auth.webhook);
    assert_eq!(
        cfg.auth.client_ca_file.as_deref(),
        Some("/etc/kubernetes/pki/ca.crt")
    );
    let file = parse_file(
            "c",
            "authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}\nauthorization: {mode: AlwaysAllow}\n",
        )
        .unwrap();
    let cfg = merge(&flags(&["--config=c"]), file, "n").unwrap();
    assert!(cfg.auth.anonymous && !cfg.auth.webhook);
    assert_eq!(cfg.auth.mode, AuthzMode::AlwaysAllow);
    let file = parse_file("c", "authorization: {mode: RBAC}\n").unwrap();
    let err = merge(&flags(&["--config=c"]), file, "n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown authorization mode RBAC"), "{err}");
}

#[test]
fn auth_cache_ttls_default_and_parse() {
    use std::time::Duration;
    let s = |d: u64| Duration::from_secs(d);
    // kubeadm writes 0s: upstream's defaulting turns zero into 2m / 5m / 30s.
    let file = parse_file("c", crate::config::tests::KUBEADM_CONFIG).unwrap();
    let cfg = merge(
        &flags(&["--config=c", "--container-runtime-endpoint=unix:///x.sock"]),
        file,
        "n",
    )
    .unwrap();
    assert_eq!(
        (
            cfg.auth.cache_ttl,
            cfg.auth.cache_authorized_ttl,
            cfg.auth.cache_unauthorized_ttl
        ),
        (s(120), s(300), s(30))
    );
    let file = parse_file(
        "c",
        "authentication: {webhook: {cacheTTL: 10s}}\nauthorization: {webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 5s}}\n",
    )
    .unwrap();
    let cfg = merge(&flags(&["--config=c"]), file, "n").unwrap();
    assert_eq!(
        (
            cfg.auth.cache_ttl,
            cfg.auth.cache_authorized_ttl,
            cfg.auth.cache_unauthorized_ttl
        ),
        (s(10), s(60), s(5))
    );
    let file = parse_file(
        "c",
        "authorization: {webhook: {cacheAuthorizedTTL: soon}}\n",
    )
    .unwrap();
    let err = merge(&flags(&["--config=c"]), file, "n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("authorization.webhook.cacheAuthorizedTTL"),
        "{err}"
    );
    // Upstream's flags win over the file; 0s from a flag turns the cache off.
    let file = parse_file("c", "authentication: {webhook: {cacheTTL: 10s}}\n").unwrap();
    let cfg = merge(
        &flags(&[
            "--config=c",
            "--authentication-token-webhook-cache-ttl=0s",
            "--authorization-webhook-cache-authorized-ttl=2m",
            "--authorization-webhook-cache-unauthorized-ttl=1s",
        ]),
        file,
        "n",
    )
    .unwrap();
    assert_eq!(
        (
            cfg.auth.cache_ttl,
            cfg.auth.cache_authorized_ttl,
            cfg.auth.cache_unauthorized_ttl
        ),
        (s(0), s(120), s(1))
    );
    let file = parse_file("c", "{}").unwrap();
    let err = merge(
        &flags(&[
            "--config=c",
            "--authorization-webhook-cache-authorized-ttl=soon",
        ]),
        file,
        "n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--authorization-webhook-cache-authorized-ttl"),
        "{err}"
    );
}

#[test]
fn tls_settings_validated() {
    let file = parse_file("c", "tlsMinVersion: VersionTLS10\n").unwrap();
    let err = merge(&flags(&[]), file, "n").unwrap_err().to_string();
    assert!(
        err.contains("tlsMinVersion") && err.contains("VersionTLS10"),
        "{err}"
    );
    let err = merge(
        &flags(&["--tls-min-version=VersionTLS11"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("VersionTLS11"), "{err}");
    let file = parse_file(
        "c",
        "tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_AES_128_GCM_SHA256]\n",
    )
    .unwrap();
    let cfg = merge(&flags(&[]), file, "n").unwrap();
    assert_eq!(cfg.tls_min_version.as_deref(), Some("VersionTLS13"));
    let err = merge(
        &flags(&["--tls-cipher-suites=TLS_RSA_WITH_3DES_EDE_CBC_SHA"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("TLS_RSA_WITH_3DES_EDE_CBC_SHA"), "{err}");
}
