//! Go-style durations (`1m30s`, `300ms`, `2h`) as they appear in KubeletConfiguration,
//! KubeProxyConfiguration and flags: Go's `time.ParseDuration` grammar and its printing.

use std::time::Duration;

/// A duration string that Go's `time.ParseDuration` would reject.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {0:?}: want a Go duration such as \"10s\", \"1m30s\" or \"250ms\"")]
pub struct DurationError(pub String);

/// Parses a Go duration string. Negative durations are rejected: no kubelet setting accepts them.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    parse_go_duration(text).ok_or_else(|| DurationError(text.to_string()))
}

/// Parses a Go `time.ParseDuration` string ("1h2m3.5s", "250ms", "0"); `None` for what Go
/// rejects, and for negative durations.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * unit;
        rest = &rest[unit_end..];
    }
    // Go's durations are an int64 of nanoseconds: anything longer is invalid there too.
    if !total.is_finite() || total > i64::MAX as f64 / 1e9 {
        return None;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Formats a duration the way Go prints it (`1m0s`, `10s`, `300ms`, `1.5µs`, `1ns`), for
/// /configz and logs.
pub fn format(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    // `v / 10^digits` with the fraction's trailing zeros dropped, as Go prints it.
    let frac = |v: u128, digits: usize| -> String {
        let unit = 10u128.pow(digits as u32);
        let (int, rem) = (v / unit, v % unit);
        if rem == 0 {
            int.to_string()
        } else {
            let r = format!("{rem:0digits$}");
            format!("{int}.{}", r.trim_end_matches('0'))
        }
    };
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", frac(ns, 3));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", frac(ns, 6));
    }
    let secs = ns / 1_000_000_000;
    let (h, m) = (secs / 3600, secs % 3600 / 60);
    let s = format!("{}s", frac(ns - (h * 3600 + m * 60) * 1_000_000_000, 9));
    match (h, m) {
        (0, 0) => s,
        (0, m) => format!("{m}m{s}"),
        (h, m) => format!("{h}h{m}m{s}"),
    }
}

/// Serde adapter for optional Go durations in config files.
pub mod serde_opt {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let raw: Option<String> = Option::deserialize(d)?;
        raw.map(|s| super::parse(&s).map_err(serde::de::Error::custom))
            .transpose()
    }

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.serialize_str(&super::format(*d)),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("1m0s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse("1h2m3s").unwrap(), Duration::from_secs(3723));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("1h0m0s"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_go_duration("2h22m"), Some(Duration::from_secs(8520)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("-1s"), None);
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("s"), None);
        assert_eq!(parse_go_duration("3d"), None);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "10", "s", "10x", "-1s", "1m-2s"] {
            assert!(parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(60)), "1m0s");
        assert_eq!(format(Duration::from_secs(10)), "10s");
        assert_eq!(format(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format(Duration::from_millis(300)), "300ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_secs(3725)), "1h2m5s");
        assert_eq!(format(Duration::ZERO), "0s");
    }
}

/// Serde adapter for plain durations, written as Go duration strings.
pub mod serde_opt_plain {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*v))
    }
}
