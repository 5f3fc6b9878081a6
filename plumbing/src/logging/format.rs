//! The two line formats: klog's text header and component-base's JSON object.

use super::fields::{Collected, Value, json_kvs, klog_kvs, quote};
use super::filter::verbosity_of;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// klog's text lines: `Lmmdd hh:mm:ss.uuuuuu pid file:line] "msg" key="value" ...`, the time
/// in UTC.
pub struct KlogText;

/// component-base's JSON lines: `{"ts":…,"caller":"dir/file.rs:12","msg":…,"v":0,…}`; an
/// error line has `err` and no `v`.
pub struct Json;

/// Span fields as klog key/values (the pod worker's `namespace`, `name`, `uid`).
pub struct KlogFields;

/// Span fields as JSON members.
pub struct JsonFields;

fn collect<R: RecordFields>(fields: R) -> Collected {
    let mut c = Collected::default();
    fields.record(&mut c);
    // A span's message (rare) stays a key/value.
    if let Some(m) = c.msg.take() {
        c.kvs.push(("message", Value::Str(m)));
    }
    if let Some(e) = c.err.take() {
        c.kvs.push(("err", Value::Str(e)));
    }
    c
}

impl<'w> FormatFields<'w> for KlogFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut out = String::new();
        klog_kvs(&collect(fields).kvs, &mut out);
        writer.write_str(&out)
    }
}

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut out = String::new();
        json_kvs(&collect(fields).kvs, &mut out);
        writer.write_str(&out)
    }
}

/// The key/values of the spans the event is in, outermost first.
fn span_fields<S, N>(ctx: &FmtContext<'_, S, N>) -> String
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let mut out = String::new();
    if let Some(scope) = ctx.event_scope() {
        for span in scope.from_root() {
            if let Some(f) = span.extensions().get::<FormattedFields<N>>() {
                out.push_str(f);
            }
        }
    }
    out
}

/// Seconds and microseconds since the epoch.
fn now() -> (u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_micros())
}

/// Month, day, hour, minute, second of a UTC time in seconds since the epoch.
pub(super) fn civil(secs: u64) -> (u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

fn severity(level: &Level) -> char {
    match *level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// The caller as klog writes it (the file name) or as zap's short caller (folder/file).
fn caller(file: Option<&str>, line: Option<u32>, parts: usize) -> String {
    let file = file.unwrap_or("???");
    let short = match file.rmatch_indices('/').nth(parts - 1) {
        Some((i, _)) => &file[i + 1..],
        None => file,
    };
    format!("{short}:{}", line.unwrap_or(0))
}

impl<S, N> FormatEvent<S, N> for KlogText
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut c = Collected::default();
        event.record(&mut c);
        let (secs, micros) = now();
        let (mo, d, h, mi, s) = civil(secs);
        let mut out = format!(
            "{}{mo:02}{d:02} {h:02}:{mi:02}:{s:02}.{micros:06} {:>7} {}] ",
            severity(meta.level()),
            std::process::id(),
            caller(meta.file(), meta.line(), 1),
        );
        quote(c.msg.as_deref().unwrap_or(""), &mut out);
        if let Some(e) = &c.err {
            out.push_str(" err=");
            quote(e, &mut out);
        }
        out.push_str(&span_fields(ctx));
        klog_kvs(&c.kvs, &mut out);
        writeln!(writer, "{out}")
    }
}

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut c = Collected::default();
        event.record(&mut c);
        let (secs, micros) = now();
        let str = |s: &str| serde_json::Value::from(s).to_string();
        let mut out = format!(
            "{{\"ts\":{secs}.{micros:06},\"caller\":{},\"msg\":{}",
            str(&caller(meta.file(), meta.line(), 2)),
            str(c.msg.as_deref().unwrap_or("")),
        );
        if *meta.level() == Level::ERROR {
            if let Some(e) = &c.err {
                out.push_str(&format!(",\"err\":{}", str(e)));
            }
        } else {
            out.push_str(&format!(",\"v\":{}", verbosity_of(meta.level())));
            if let Some(e) = c.err.take() {
                c.kvs.insert(0, ("err", Value::Str(e)));
            }
        }
        out.push_str(&span_fields(ctx));
        json_kvs(&c.kvs, &mut out);
        out.push('}');
        writeln!(writer, "{out}")
    }
}
