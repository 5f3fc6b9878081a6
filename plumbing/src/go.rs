//! Go's scalar spellings, as upstream's flags, query parameters and config files accept them.

/// Parses a boolean the way Go's `strconv.ParseBool` does (pflag and the API's query decoding
/// use it): `1 t T true TRUE True` and `0 f F false FALSE False`; anything else is `None`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_spellings_only() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", "on", " true", "2"] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }
}
