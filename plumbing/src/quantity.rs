//! Kubernetes resource quantities ("100m", "1.5", "128Mi", "1G", "1e3") as integers.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity the kubelet cannot use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantityError {
    /// Not the Kubernetes quantity grammar.
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
    )]
    Syntax(String),
    /// Its value in thousandths does not fit in 64 bits (upstream's MilliValue).
    #[error(
        "quantity {0:?} is too large: its value in thousandths must fit in a signed 64-bit integer"
    )]
    TooLarge(String),
}

/// The largest magnitude [`parse_milli`] returns: an int64 of thousandths, as upstream's
/// MilliValue; whatever is computed from it in i128 cannot overflow.
pub const MAX_MILLI: i128 = i64::MAX as i128;

/// The value in thousandths ("milli" units): "100m" → 100, "2" → 2000, "1Ki" → 1_024_000.
/// Its magnitude is at most [`MAX_MILLI`].
pub fn parse_milli(q: &str) -> Result<i128, QuantityError> {
    let err = || QuantityError::Syntax(q.to_string());
    let too_large = || QuantityError::TooLarge(q.to_string());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num == "+" || num == "-" {
        return Err(err());
    }
    let negative = num.starts_with('-');
    let digits = num.strip_prefix(['+', '-']).unwrap_or(num);
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err());
    }
    if !(int_part.bytes().all(|c| c.is_ascii_digit())
        && frac_part.bytes().all(|c| c.is_ascii_digit()))
    {
        return Err(err());
    }
    // value = int.frac × multiplier, computed in thousandths without floating point.
    let (mul_num, mul_den): (i128, i128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "u" => (1, 1_000_000),
        "n" => (1, 1_000_000_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| err())?;
            if exp >= 0 {
                (10i128.checked_pow(exp as u32).ok_or_else(too_large)?, 1)
            } else {
                (
                    1,
                    10i128
                        .checked_pow(exp.unsigned_abs())
                        .ok_or_else(too_large)?,
                )
            }
        }
        _ => return Err(err()),
    };
    let frac_den = 10i128.pow(frac_part.len().min(30) as u32);
    let digits = format!("{int_part}{}", &frac_part[..frac_part.len().min(30)]);
    let digits = digits.trim_start_matches('0');
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| too_large())?
    };
    // Round up like Kubernetes does when a value is not representable.
    let numer = mantissa
        .checked_mul(mul_num)
        .and_then(|n| n.checked_mul(1000))
        .ok_or_else(too_large)?;
    let denom = frac_den.checked_mul(mul_den).ok_or_else(too_large)?;
    let v = numer.checked_add(denom - 1).ok_or_else(too_large)? / denom;
    if v > MAX_MILLI {
        return Err(too_large());
    }
    Ok(if negative { -v } else { v })
}

/// Whole units, rounded up ("100m" → 1, "128Mi" → 134217728).
pub fn parse_value(q: &str) -> Result<i128, QuantityError> {
    let m = parse_milli(q)?;
    Ok((m + 999).div_euclid(1000))
}

/// Reads a k8s-openapi quantity as milli units.
pub fn milli(q: &Quantity) -> Result<i128, QuantityError> {
    parse_milli(&q.0)
}

/// Reads a k8s-openapi quantity as whole units.
pub fn value(q: &Quantity) -> Result<i128, QuantityError> {
    parse_value(&q.0)
}

/// How Go's Quantity prints `v` whole units created as BinarySI (`resource.NewQuantity(v,
/// resource.BinarySI).String()`): `100Mi`; a value between -1024 and 1024 or one that is not
/// a multiple of 1024 in DecimalSI's form (`1k`, `1000001`).
pub fn format_binary_si(v: i128) -> String {
    format_milli(v.saturating_mul(1000), Format::BinarySi)
}

/// The canonical text Go's Quantity prints for a parsed quantity (`String()`): the format
/// comes from the suffix (`Ki`… BinarySI, `e3` DecimalExponent, else DecimalSI), e.g.
/// `0.5Gi` → `512Mi`, `1000M` → `1G`, `1.5k` → `1500`, `129e6` → `129e6`.
pub fn canonical(q: &str) -> Result<String, QuantityError> {
    let milli = parse_milli(q)?;
    let suffix = q
        .trim()
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '+' || c == '-');
    let format = if suffix.ends_with('i') {
        Format::BinarySi
    } else if suffix.starts_with(['e', 'E']) {
        Format::DecimalExponent
    } else {
        Format::DecimalSi
    };
    Ok(format_milli(milli, format))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    BinarySi,
    DecimalSi,
    DecimalExponent,
}

/// Go's CanonicalizeBytes over a value in thousandths.
fn format_milli(milli: i128, format: Format) -> String {
    if milli == 0 {
        return "0".into();
    }
    if format == Format::BinarySi && milli.abs() >= 1024 * 1000 && milli % 1000 == 0 {
        const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        let mut n = milli / 1000;
        let mut exp = 0;
        while exp < SUFFIXES.len() && n % 1024 == 0 {
            n /= 1024;
            exp += 1;
        }
        return match exp {
            0 => n.to_string(),
            e => format!("{n}{}", SUFFIXES[e - 1]),
        };
    }
    // Decimal: the mantissa without trailing zeros, then the exponent lowered to a multiple
    // of three.
    let (mut n, mut exp) = (milli, -3i32);
    while n % 10 == 0 {
        n /= 10;
        exp += 1;
    }
    let extra = exp.rem_euclid(3);
    n *= 10i128.pow(extra as u32);
    exp -= extra;
    if format == Format::DecimalExponent {
        return if exp == 0 {
            n.to_string()
        } else {
            format!("{n}e{exp}")
        };
    }
    let suffix = match exp {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return format!("{n}e{exp}"),
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_forms() {
        assert_eq!(parse_milli("100m").unwrap(), 100);
        assert_eq!(parse_milli("2").unwrap(), 2000);
        assert_eq!(parse_milli("0.5").unwrap(), 500);
        assert_eq!(parse_value("128Mi").unwrap(), 128 << 20);
        assert_eq!(parse_value("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_value("1e3").unwrap(), 1000);
        assert_eq!(parse_value("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_value("100m").unwrap(), 1);
    }

    /// Values past an int64 of thousandths are an error, never a panic or a wrapped number.
    #[test]
    fn overflow_is_an_error() {
        for big in [
            "99999999999999999999999999999999Ei",
            "1e40",
            "1e-100000",
            "9223372036854775808m",
            "10000000000000000",
            "123456789012345678901234567890.123456789012345678901234567890P",
        ] {
            assert!(
                matches!(parse_milli(big), Err(QuantityError::TooLarge(_))),
                "{big}: {:?}",
                parse_milli(big)
            );
        }
        assert_eq!(parse_milli("9223372036854775807m").unwrap(), MAX_MILLI);
        assert_eq!(parse_milli("-1Ki").unwrap(), -1_024_000);
        assert!(matches!(
            parse_milli("-8Ei"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn garbage_rejected() {
        for bad in ["", "abc", "1x", "--1", "1.2.3", "Mi"] {
            assert!(parse_milli(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn canonical_as_go_prints_it() {
        for (have, want) in [
            ("100Mi", "100Mi"),
            ("0.5Gi", "512Mi"),
            ("1024Mi", "1Gi"),
            ("1536Ki", "1536Ki"),
            ("1000M", "1G"),
            ("1500000", "1500k"),
            ("128974848", "128974848"),
            ("1.5k", "1500"),
            ("0.5", "500m"),
            ("129e6", "129e6"),
            ("1e3", "1e3"),
            ("0", "0"),
            ("0Mi", "0"),
            ("100", "100"),
            ("1000", "1k"),
        ] {
            assert_eq!(canonical(have).unwrap(), want, "{have}");
        }
        assert_eq!(format_binary_si(100 << 20), "100Mi");
        assert_eq!(format_binary_si(1000), "1k");
        assert_eq!(format_binary_si(1023), "1023");
        assert_eq!(format_binary_si(1024), "1Ki");
        assert_eq!(format_binary_si(1025), "1025");
        assert_eq!(format_binary_si(3_000_000_000), "3000000000");
    }
}
