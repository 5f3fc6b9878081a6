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

/// [`parse_bool`] for a flag value, with `strconv.ParseBool`'s error text.
pub fn flag_bool(s: &str) -> Result<bool, String> {
    parse_bool(s).ok_or_else(|| format!("strconv.ParseBool: parsing {s:?}: invalid syntax"))
}

/// Parses a `Name=bool,...` flag as component-base's `MapStringBool` does (`--feature-gates`):
/// names and values trimmed, each value read with [`parse_bool`], upstream's error texts.
pub fn parse_map_string_bool(s: &str) -> Result<std::collections::BTreeMap<String, bool>, String> {
    let mut out = std::collections::BTreeMap::new();
    for item in s.split(',').filter(|i| !i.trim().is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("missing bool value for {item}"));
        };
        let (k, v) = (k.trim(), v.trim());
        let b = flag_bool(v).map_err(|e| format!("invalid value of {k}={v}, err: {e}"))?;
        out.insert(k.to_string(), b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_string_bool_as_component_base() {
        let m = parse_map_string_bool("A=1, B = f,C=TRUE").unwrap();
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![
                ("A".to_string(), true),
                ("B".to_string(), false),
                ("C".to_string(), true)
            ]
        );
        assert_eq!(
            parse_map_string_bool("A=maybe").unwrap_err(),
            "invalid value of A=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        );
        assert_eq!(
            parse_map_string_bool("A").unwrap_err(),
            "missing bool value for A"
        );
    }

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
