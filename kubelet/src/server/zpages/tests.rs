use super::*;
use std::time::Duration;

#[test]
fn negotiation_follows_upstream() {
    let st = |a: Option<&str>| negotiate(a, "Statusz");
    assert_eq!(st(None), Some(Format::Text));
    assert_eq!(st(Some("")), Some(Format::Text));
    assert_eq!(st(Some("*/*")), Some(Format::Text));
    assert_eq!(st(Some("text/plain; charset=UTF-8")), Some(Format::Text));
    // kubectl get --raw's header: JSON first, but the bare JSON type is not acceptable.
    assert_eq!(st(Some("application/json, */*")), Some(Format::Text));
    assert_eq!(
        st(Some(
            "application/json;v=v1beta1;g=config.k8s.io;as=Statusz"
        )),
        Some(Format::Json("v1beta1"))
    );
    assert_eq!(
        st(Some(
            "text/plain;q=0.5, application/json;g=config.k8s.io;v=v1alpha1;as=Statusz"
        )),
        Some(Format::Json("v1alpha1"))
    );
    // Missing or wrong g/v/as, other charsets, other types: 406.
    for bad in [
        "application/json",
        "application/json;v=v1beta1;g=config.k8s.io",
        "application/json;v=v1beta1;g=config.k8s.io;as=Flagz",
        "application/json;v=v2;g=config.k8s.io;as=Statusz",
        "application/json;v=v1beta1;g=apps;as=Statusz",
        "text/plain;charset=latin1",
        "text/html",
        "text/plain;q=0",
        ";;;,=,\u{0}",
    ] {
        assert_eq!(st(Some(bad)), None, "{bad}");
    }
}

#[test]
fn uptime_and_dates_as_upstream_prints_them() {
    assert_eq!(uptime_text(3665), "1 hr 01 min 05 sec");
    assert_eq!(uptime_text(16), "0 hr 00 min 16 sec");
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_729_112_623); // 2024-10-16 21:03:43
    assert_eq!(unix_date(t), "Wed Oct 16 21:03:43 UTC 2024");
    let early = SystemTime::UNIX_EPOCH + Duration::from_secs(1_725_580_800);
    assert_eq!(unix_date(early), "Fri Sep  6 00:00:00 UTC 2024");
}

fn debug_at(start: SystemTime) -> Debug {
    Debug {
        start,
        flags: [
            (
                "config".to_string(),
                "/var/lib/kubelet/config.yaml".to_string(),
            ),
            ("v".to_string(), "2".to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// The value after a key and upstream's random delimiter (`:`, `: `, `=` or ` `).
fn value_of<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    body.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?;
        let rest = [": ", ":", "=", " "]
            .iter()
            .find_map(|d| rest.strip_prefix(d))?;
        Some(rest.trim_start())
    })
}

#[test]
fn statusz_text_and_json() {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_729_112_623);
    let d = debug_at(start);
    let paths = listed_paths(&d, true);
    let now = start + Duration::from_secs(3665);
    let text = statusz_body(&d, &paths, Format::Text, now);
    assert!(
        text.starts_with(
            "\nkubelet statusz\nWarning: This endpoint is not meant to be machine parseable"
        ),
        "{text}"
    );
    assert_eq!(
        value_of(&text, "Started"),
        Some("Wed Oct 16 21:03:43 UTC 2024")
    );
    assert_eq!(value_of(&text, "Up"), Some("1 hr 01 min 05 sec"));
    assert_eq!(
        value_of(&text, "Binary version"),
        Some(crate::KUBERNETES_VERSION.trim_start_matches('v'))
    );
    let listed = value_of(&text, "Paths").unwrap();
    for p in [
        "/configz",
        "/debug/flags/v",
        "/flagz",
        "/healthz",
        "/pods",
        "/statusz",
    ] {
        assert!(listed.split(' ').any(|x| x == p), "{p} in {listed}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&statusz_body(&d, &paths, Format::Json("v1beta1"), now)).unwrap();
    assert_eq!(json["kind"], "Statusz");
    assert_eq!(json["apiVersion"], "config.k8s.io/v1beta1");
    assert_eq!(json["metadata"]["name"], "kubelet");
    assert_eq!(json["startTime"], "2024-10-16T21:03:43Z");
    assert_eq!(json["uptimeSeconds"], 3665);
    assert!(
        json["paths"]
            .as_array()
            .unwrap()
            .contains(&"/statusz".into())
    );
}

#[test]
fn listed_paths_follow_the_switches() {
    let mut d = Debug::default();
    let on = listed_paths(&d, true);
    assert!(on.contains(&"/exec") && on.contains(&"/debug/flags/v"));
    let off = listed_paths(&d, false);
    assert!(!off.contains(&"/exec") && !off.contains(&"/debug/flags/v"));
    d.flags_handler = false;
    d.flagz = false;
    let p = listed_paths(&d, true);
    assert!(!p.contains(&"/debug/flags/v") && !p.contains(&"/flagz"));
    assert!(p.contains(&"/statusz"));
}

#[test]
fn flagz_text_and_json() {
    let d = debug_at(SystemTime::now());
    let text = flagz_body(&d, Format::Text);
    assert!(text.starts_with("\nkubelet flags\nWarning: "), "{text}");
    assert_eq!(
        value_of(&text, "config"),
        Some("/var/lib/kubelet/config.yaml")
    );
    assert_eq!(value_of(&text, "v"), Some("2"));
    let json: serde_json::Value =
        serde_json::from_str(&flagz_body(&d, Format::Json("v1alpha1"))).unwrap();
    assert_eq!(json["kind"], "Flagz");
    assert_eq!(json["apiVersion"], "config.k8s.io/v1alpha1");
    assert_eq!(json["flags"]["v"], "2");
}
