//! The two formats on captured lines.

use super::*;
use std::sync::Mutex;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

/// The lines `f` logs in `format` at verbosity `v`.
fn lines(format: Format, v: i32, f: impl FnOnce()) -> Vec<String> {
    let cap = Capture::default();
    let sub = tracing_subscriber::registry()
        .with(KlogFilter::new(v, vec![]))
        .with(format_layer(format, cap.clone()));
    tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_string).collect()
}

fn sample() {
    let span = tracing::info_span!("pod", namespace = "default", name = "web", uid = "u-1");
    let _g = span.enter();
    tracing::info!(count = 3, ready = true, node = "n1", "Pod started");
    tracing::debug!("debug line");
    tracing::trace!("trace line");
    let e = std::io::Error::other("disk \"full\"");
    tracing::warn!(error = %e, "Retrying");
    tracing::error!(error = %e, path = "/var/lib", "Failed to write");
}

#[test]
fn klog_text_header_and_key_values() {
    let got = lines(Format::Text, 0, sample);
    let header =
        regex::Regex::new(r"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}\s+\d+ [^:]+:\d+\] ").unwrap();
    assert_eq!(got.len(), 3, "{got:#?}");
    for l in &got {
        assert!(header.is_match(l), "{l}");
        assert!(l.contains(" tests.rs:"), "{l}");
    }
    assert!(got[0].starts_with('I'), "{}", got[0]);
    assert!(
        got[0].ends_with(
            "] \"Pod started\" namespace=\"default\" name=\"web\" uid=\"u-1\" count=3 ready=true node=\"n1\""
        ),
        "{}",
        got[0]
    );
    assert!(got[1].starts_with('W'), "{}", got[1]);
    assert!(
        got[1].contains("] \"Retrying\" err=\"disk \\\"full\\\"\""),
        "{}",
        got[1]
    );
    assert!(got[2].starts_with('E'), "{}", got[2]);
    assert!(got[2].ends_with("path=\"/var/lib\""), "{}", got[2]);
    assert!(!got[0].contains(&format!("{}", '\u{1b}')), "no colours");
}

#[test]
fn klog_verbosity_shows_debug_from_2_and_trace_from_5() {
    let msgs = |v| -> Vec<String> { lines(Format::Text, v, sample) };
    assert!(!msgs(1).iter().any(|l| l.contains("debug line")));
    assert!(msgs(2).iter().any(|l| l.contains("debug line")));
    assert!(!msgs(4).iter().any(|l| l.contains("trace line")));
    assert!(msgs(5).iter().any(|l| l.contains("trace line")));
}

#[test]
fn json_fields_as_component_base() {
    let got = lines(Format::Json, 2, sample);
    let objs: Vec<serde_json::Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(objs.len(), 4, "{got:#?}");
    let info = &objs[0];
    assert!(info["ts"].is_f64(), "{info}");
    let ts = info["ts"].as_f64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - ts).abs() < 60.0, "{ts} vs {now}");
    let caller = info["caller"].as_str().unwrap();
    assert!(
        regex::Regex::new(r"^logging/tests\.rs:\d+$")
            .unwrap()
            .is_match(caller),
        "{caller}"
    );
    assert_eq!(info["msg"], "Pod started");
    assert_eq!(info["v"], 0);
    assert_eq!(info["count"], 3);
    assert_eq!(info["ready"], true);
    assert_eq!(info["namespace"], "default");
    assert_eq!(info["name"], "web");
    assert_eq!(info["uid"], "u-1");
    assert_eq!(objs[1]["msg"], "debug line");
    assert_eq!(objs[1]["v"], 2);
    let warn = &objs[2];
    assert_eq!(warn["v"], 0);
    assert_eq!(warn["err"], "disk \"full\"");
    let err = &objs[3];
    assert_eq!(err["msg"], "Failed to write");
    assert_eq!(err["err"], "disk \"full\"");
    assert!(err.get("v").is_none(), "{err}");
    assert_eq!(err["path"], "/var/lib");
    assert!(got[0].starts_with("{\"ts\":"), "ts first: {}", got[0]);
}

#[test]
fn a_message_field_beside_the_format_string_stays_a_key_value() {
    let got = lines(Format::Text, 0, || {
        tracing::info!(reason = "Failed", message = "hook failed", "event");
    });
    assert!(
        got[0].ends_with("] \"event\" reason=\"Failed\" message=\"hook failed\""),
        "{}",
        got[0]
    );
}

#[test]
fn civil_dates() {
    // 2026-12-07 21:02:42 UTC
    assert_eq!(format::civil(1_796_677_362), (12, 7, 21, 2, 42));
    assert_eq!(format::civil(0), (1, 1, 0, 0, 0));
    // 2024-02-29 12:00:00 UTC
    assert_eq!(format::civil(1_709_208_000), (2, 29, 12, 0, 0));
}

#[test]
fn options_flags_win_over_the_file() {
    let file = serde_json::json!({
        "format": "json",
        "verbosity": 3,
        "vmodule": [{"filePattern": "pod_*", "verbosity": 5}],
        "options": {"json": {"splitStream": true}},
    });
    let o = Options::resolve(&Flags::default(), Some(&file)).unwrap();
    assert_eq!(o.format, Format::Json);
    assert_eq!(o.verbosity, 3);
    assert_eq!(o.vmodule[0].pattern, "pod_*");
    assert!(o.split_stream);
    let flags = Flags {
        format: Some("text"),
        verbosity: Some(1),
        vmodule: Some("status=4,pleg=2"),
        ..Flags::default()
    };
    let o = Options::resolve(&flags, Some(&file)).unwrap();
    assert_eq!(
        (o.format, o.verbosity, o.split_stream),
        (Format::Text, 1, false)
    );
    assert_eq!(o.vmodule.len(), 2);
    assert_eq!(o.vmodule[1].verbosity, 2);
}

#[test]
fn unknown_format_and_bad_vmodule_are_refused() {
    let flags = Flags {
        format: Some("xml"),
        ..Flags::default()
    };
    let e = Options::resolve(&flags, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "logging.format: Invalid value: \"xml\": Unsupported log format"
    );
    let file = serde_json::json!({"format": "yaml"});
    assert!(Options::resolve(&Flags::default(), Some(&file)).is_err());
    let flags = Flags {
        vmodule: Some("pod_worker"),
        ..Flags::default()
    };
    assert!(Options::resolve(&flags, None).is_err());
}
