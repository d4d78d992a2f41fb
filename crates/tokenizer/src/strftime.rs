//! `strftime_now(format)`, the clock function Hugging Face's chat template renderer gives
//! templates (gpt-oss's writes `Current date: {{ strftime_now("%Y-%m-%d") }}`), in UTC:
//! the Python one reads the host's local time, which a server shared across time zones
//! has no single answer for.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The template function: the current UTC time in `format`.
pub(crate) fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(&format, secs).map(Value::from)
}

/// `secs` after the Unix epoch in `format`: `%Y %m %d %H %M %S %B %b %A %a %%` as
/// Python's `strftime` writes them; any other directive is an error naming it.
pub(crate) fn format_utc(format: &str, secs: u64) -> Result<String, Error> {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil(days);
    let mut out = String::with_capacity(format.len() + 8);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[((days + 4) % 7) as usize]),
            Some('a') => out.push_str(&DAYS[((days + 4) % 7) as usize][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: directive %{} is not supported",
                        other.map_or(String::new(), String::from)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// The proleptic Gregorian (year, month, day) of `days` after 1970-01-01.
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dates from Python's `datetime.fromtimestamp(secs, timezone.utc).strftime(...)`.
    #[test]
    fn dates_are_pythons() {
        let f = "%Y-%m-%d %H:%M:%S %a %A %b %B %%";
        let cases = [
            (0, "1970-01-01 00:00:00 Thu Thursday Jan January %"),
            (
                951_782_400,
                "2000-02-29 00:00:00 Tue Tuesday Feb February %",
            ),
            (
                1_767_225_599,
                "2025-12-31 23:59:59 Wed Wednesday Dec December %",
            ),
            (1_772_323_200, "2026-03-01 00:00:00 Sun Sunday Mar March %"),
        ];
        for (secs, want) in cases {
            assert_eq!(format_utc(f, secs).unwrap(), want, "{secs}");
        }
        let e = format_utc("%Y-%j", 0).unwrap_err().to_string();
        assert!(e.contains("%j"), "{e}");
    }
}
