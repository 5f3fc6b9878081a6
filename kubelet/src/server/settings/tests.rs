use super::*;

/// The `nodeAgentServer` section of a config file.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct File {
    node_agent_server: Option<FileSettings>,
}

fn parse(text: &str) -> Result<Settings, String> {
    let file: File = serde_saphyr::from_str(text).unwrap();
    merge(file.node_agent_server.as_ref())
}

#[test]
fn connection_limits_default_and_parse() {
    assert_eq!(parse("{}").unwrap(), Settings::default());
    assert_eq!(
        Settings::default(),
        Settings {
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
