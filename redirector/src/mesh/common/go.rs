//! Go's value parsers, as the meshes' Go binaries read their flags and env vars: pflag
//! hands a flag's text to `strconv`, so a value a mesh's own command accepts is accepted
//! here, and nothing else.

/// Go's `strconv.ParseBool`: exactly `1 t T TRUE true True` and `0 f F FALSE false False`
/// (no blanks, no other case).
pub fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.ParseInt(text, 0, 64)`, as pflag reads an int flag: an optional sign, then
/// decimal, `0x` hex, `0o` or leading-`0` octal, or `0b` binary. (Go's `_` digit separators
/// are not accepted.)
pub fn parse_int(text: &str) -> Option<i64> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, digits) = if let Some(hex) = lower.strip_prefix("0x") {
        (16, hex)
    } else if let Some(bin) = lower.strip_prefix("0b") {
        (2, bin)
    } else if let Some(oct) = lower.strip_prefix("0o") {
        (8, oct)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    // from_str_radix alone would take a sign after the prefix ("0x+5").
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from(u64::from_str_radix(digits, radix).ok()?);
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_exactly_go_s() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_bool(yes), Some(true), "{yes:?}");
        }
        for no in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_bool(no), Some(false), "{no:?}");
        }
        for bad in [
            "yes", "no", "2", "on", "", "tRuE", " true", "true ", "fALSE",
        ] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn integers_are_go_s() {
        for (text, want) in [
            ("4143", Some(4143)),
            ("+5", Some(5)),
            ("-1", Some(-1)),
            ("0", Some(0)),
            ("0x10", Some(16)),
            ("0X10", Some(16)),
            ("-0x10", Some(-16)),
            ("010", Some(8)),
            ("0o10", Some(8)),
            ("0b101", Some(5)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("08", None),
            ("0x", None),
            ("0x+5", None),
            ("", None),
            ("-", None),
            (" 1", None),
            ("1_000", None),
            ("abc", None),
        ] {
            assert_eq!(parse_int(text), want, "{text:?}");
        }
    }
}
