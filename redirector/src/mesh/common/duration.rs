//! Go's `time.ParseDuration`, for `--probe-timeout` ("5s", "500ms", "1m30s").

use std::time::Duration;

/// Go only accepts 15-18 significant fraction digits in practice; more cannot change a
/// nanosecond count and would overflow the arithmetic below.
const MAX_FRACTION_DIGITS: usize = 18;

/// Parses a Go duration: an optional sign, then one or more `<decimal><unit>` terms with units
/// ns, us (µs, μs), ms, s, m, h; or a bare "0". Returns `None` for anything Go rejects and for
/// negative durations, which a `Duration` cannot hold.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = split_digits(rest);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => split_digits(after),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            _ => return None,
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        nanos = nanos.checked_add(whole.checked_mul(unit_nanos)?)?;
        let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
        if !fraction.is_empty() {
            let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
            nanos += fraction.parse::<u128>().ok()? * unit_nanos / scale;
        }
        // Go keeps durations in an int64 of nanoseconds.
        if nanos > i64::MAX as u128 {
            return None;
        }
        rest = after;
    }
    if negative && nanos != 0 {
        return None;
    }
    Some(Duration::from_nanos(u64::try_from(nanos).ok()?))
}

fn split_digits(text: &str) -> (&str, &str) {
    text.split_at(text.bytes().take_while(u8::is_ascii_digit).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_go_durations() {
        let cases = [
            ("5s", Duration::from_secs(5)),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("2s", Duration::from_secs(2)),
            ("1h", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("10μs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            ("+5s", Duration::from_secs(5)),
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("0.000000001s", Duration::from_nanos(1)),
            (
                "0.1234567890123456789999s",
                Duration::from_nanos(123_456_789),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text), Some(want), "{text:?}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            "", "5", "s", ".s", "5 s", "5S", "5sec", "1d", "-5s", "+", "-", "5s3", "3000000h",
            "1..5s",
        ] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }
}
