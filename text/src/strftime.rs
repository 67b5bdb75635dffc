//! `strftime_now` for chat templates: the common C `strftime` codes on a UTC wall clock.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

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
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A calendar date and time of day (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    /// Year, e.g. 2026.
    pub year: i32,
    /// Month, 1..=12.
    pub month: u32,
    /// Day of the month, 1..=31.
    pub day: u32,
    /// Hour, 0..=23.
    pub hour: u32,
    /// Minute, 0..=59.
    pub minute: u32,
    /// Second, 0..=59.
    pub second: u32,
}

impl CivilTime {
    /// The current UTC time.
    pub fn now_utc() -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()) as i64;
        Self::from_unix(secs)
    }

    /// The UTC time `secs` seconds after 1970-01-01 (days-to-civil after Howard Hinnant's algorithm).
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
        Self {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    fn days_from_epoch(&self) -> i64 {
        let y = i64::from(self.year) - i64::from(self.month <= 2);
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(self.month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    fn weekday(&self) -> usize {
        // 1970-01-01 was a Thursday (index 3 from Monday).
        (self.days_from_epoch() + 3).rem_euclid(7) as usize
    }

    fn day_of_year(&self) -> i64 {
        let jan1 = CivilTime {
            month: 1,
            day: 1,
            ..*self
        };
        self.days_from_epoch() - jan1.days_from_epoch() + 1
    }

    /// Formats with `%Y %y %m %d %e %H %I %M %S %p %B %b %h %A %a %j %%` and the `%-d` style unpadded forms.
    pub fn format(&self, fmt: &str) -> String {
        let mut out = String::new();
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut code = chars.next();
            let unpadded = code == Some('-');
            if unpadded {
                code = chars.next();
            }
            let num = |out: &mut String, v: i64, width: usize| {
                if unpadded {
                    let _ = write!(out, "{v}");
                } else {
                    let _ = write!(out, "{v:0width$}");
                }
            };
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match code {
                Some('Y') => num(&mut out, i64::from(self.year), 4),
                Some('y') => num(&mut out, i64::from(self.year).rem_euclid(100), 2),
                Some('m') => num(&mut out, i64::from(self.month), 2),
                Some('d') => num(&mut out, i64::from(self.day), 2),
                Some('e') => {
                    let _ = write!(out, "{:2}", self.day);
                }
                Some('H') => num(&mut out, i64::from(self.hour), 2),
                Some('I') => num(&mut out, i64::from(hour12), 2),
                Some('M') => num(&mut out, i64::from(self.minute), 2),
                Some('S') => num(&mut out, i64::from(self.second), 2),
                Some('j') => num(&mut out, self.day_of_year(), 3),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('B') => out.push_str(MONTHS[(self.month as usize + 11) % 12]),
                Some('b') | Some('h') => {
                    out.push_str(&MONTHS[(self.month as usize + 11) % 12][..3])
                }
                Some('A') => out.push_str(DAYS[self.weekday()]),
                Some('a') => out.push_str(&DAYS[self.weekday()][..3]),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python_strftime() {
        let t = CivilTime::from_unix(1_796_065_509); // 2026-11-30 19:05:09 UTC, a Monday
        assert_eq!(
            t,
            CivilTime {
                year: 2026,
                month: 11,
                day: 30,
                hour: 19,
                minute: 5,
                second: 9
            }
        );
        assert_eq!(t.format("%d %b %Y"), "30 Nov 2026");
        assert_eq!(
            t.format("%A, %B %-d, %Y %I:%M %p (%j) %%"),
            "Monday, November 30, 2026 07:05 PM (334) %"
        );
    }
}
