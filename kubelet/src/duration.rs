//! Go-style durations (`1m30s`, `300ms`, `2h`) as they appear in KubeletConfiguration and flags.

use std::time::Duration;

/// A duration string that Go's `time.ParseDuration` would reject.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {0:?}: want a Go duration such as \"10s\", \"1m30s\" or \"250ms\"")]
pub struct DurationError(pub String);

/// Parses a Go duration string. Negative durations are rejected: no kubelet setting accepts them.
/// (The grammar is kube-proxy's parser's, shared.)
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    proxy::config::parse_go_duration(text).ok_or_else(|| DurationError(text.to_string()))
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
