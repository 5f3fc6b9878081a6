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
}
