//! Link rates, shown the way `tc` writes them.
//!
//! Read in multirail's one rate syntax
//! ([`multirail_proto::units::parse_rate`], the same for `@RATE` in rail
//! specs and `MULTIRAIL_FAULTS`): bits as `2gbit`, `500mbit`, `1gibit`
//! (any case, optionally `/s`), bytes as `250MB/s`, `1GiB/s`. A bare
//! number (bits or bytes?) and `kbps`, `Mbps`, ... are refused: `tc`
//! reads `100Mbps` as 100 *megabytes* per second, other tools as megabits.
//!
//! The kernel stores rates in whole bytes per second, so a [`Rate`] does too;
//! `1001bit` becomes 125 bytes/s, shown as `1kbit`, exactly as `tc` would.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// A shaping rate in bytes per second (the kernel's unit), shown in bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate {
    bytes_per_sec: u64,
}

/// Units tried, largest first, when formatting; the first that divides the
/// rate exactly wins.
const DISPLAY_UNITS: &[(&str, u64)] =
    &[("tbit", 1_000_000_000_000), ("gbit", 1_000_000_000), ("mbit", 1_000_000), ("kbit", 1_000)];

impl Rate {
    /// A rate of `bytes_per_sec` bytes per second; `None` for zero.
    pub const fn from_bytes_per_sec(bytes_per_sec: u64) -> Option<Rate> {
        if bytes_per_sec == 0 { None } else { Some(Rate { bytes_per_sec }) }
    }

    /// A rate of `bits` bits per second, truncated to whole bytes like `tc`;
    /// `None` below 8 bit/s.
    pub const fn from_bits_per_sec(bits: u64) -> Option<Rate> {
        Rate::from_bytes_per_sec(bits / 8)
    }

    /// Bytes per second, the unit `tc` and the kernel use.
    pub const fn bytes_per_sec(self) -> u64 {
        self.bytes_per_sec
    }

    /// Bits per second.
    pub const fn bits_per_sec(self) -> u64 {
        self.bytes_per_sec.saturating_mul(8)
    }

    /// The argument to give `tc ... rate`: exact, in bits.
    pub fn tc_arg(self) -> String {
        format!("{}bit", self.bits_per_sec())
    }
}

impl FromStr for Rate {
    type Err = Error;
    fn from_str(text: &str) -> Result<Rate> {
        let bad = |reason: String| Error::InvalidRate { input: text.to_owned(), reason };
        let bits = multirail_proto::units::parse_rate(text).map_err(bad)?;
        Rate::from_bits_per_sec(bits).ok_or_else(|| bad("must be at least 8bit (one byte per second)".into()))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.bits_per_sec();
        for &(name, scale) in DISPLAY_UNITS {
            if bits.is_multiple_of(scale) {
                return write!(f, "{}{name}", bits / scale);
            }
        }
        write!(f, "{bits}bit")
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses `2gbit` (one rate) or `1gbit,3gbit` (one per rail).
pub fn parse_rates(text: &str) -> Result<Vec<Rate>> {
    text.split(',').map(str::parse).collect()
}

/// Formats rates back into the `1gbit,3gbit` form.
pub fn format_rates(rates: &[Rate]) -> String {
    let parts: Vec<String> = rates.iter().map(Rate::to_string).collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(text: &str) -> u64 {
        text.parse::<Rate>().unwrap().bits_per_sec()
    }

    #[test]
    fn tc_bit_units() {
        assert_eq!(bits("2gbit"), 2_000_000_000);
        assert_eq!(bits("500mbit"), 500_000_000);
        assert_eq!(bits("64kbit"), 64_000);
        assert_eq!(bits("800bit"), 800);
        assert_eq!(bits("1tbit"), 1_000_000_000_000);
        assert_eq!(bits("1kibit"), 1024);
        assert_eq!(bits("1mibit"), 1 << 20);
        assert_eq!(bits("1gibit"), 1 << 30);
    }

    #[test]
    fn case_fractions_and_spaces() {
        assert_eq!(bits("2Gbit"), 2_000_000_000);
        assert_eq!(bits("1.5gbit"), 1_500_000_000);
        assert_eq!(bits(".5mbit"), 500_000);
        assert_eq!(bits("2.gbit"), 2_000_000_000);
        assert_eq!(bits(" 1gbit "), 1_000_000_000);
    }

    #[test]
    fn truncates_to_whole_bytes_like_tc() {
        assert_eq!(bits("1001bit"), 1000);
        assert_eq!("1001bit".parse::<Rate>().unwrap().bytes_per_sec(), 125);
    }

    #[test]
    fn rejects_nonsense() {
        for bad in ["", "gbit", "2 gbit", "2xbit", "-1gbit", "1.2.3gbit", "0", "7bit", "1e9", "800"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad:?} should be rejected");
        }
        assert!("99999999999999999999tbit".parse::<Rate>().is_err());
    }

    #[test]
    fn ambiguous_units_are_refused_with_a_reason() {
        let err = "100Mbps".parse::<Rate>().unwrap_err().to_string();
        assert!(err.contains("bytes per second"), "{err}");
        assert!(err.contains("mbit"), "{err}");
    }

    #[test]
    fn byte_rates_as_everywhere_in_multirail() {
        assert_eq!(bits("250MB/s"), 2_000_000_000);
        assert_eq!(bits("1GiB/s"), 8 << 30);
        assert_eq!(bits("2Gbit/s"), 2_000_000_000);
    }

    #[test]
    fn display_round_trips() {
        let cases = [
            ("2gbit", "2gbit"),
            ("2000mbit", "2gbit"),
            ("1500mbit", "1500mbit"),
            ("64kbit", "64kbit"),
            ("1000bit", "1kbit"),
            ("1tbit", "1tbit"),
            ("8bit", "8bit"),
        ];
        for (text, shown) in cases {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.to_string(), shown);
            assert_eq!(rate.to_string().parse::<Rate>().unwrap(), rate);
        }
        let odd: Rate = "1mibit".parse().unwrap();
        assert_eq!(odd.to_string(), "1048576bit");
        assert_eq!(odd.tc_arg(), "1048576bit");
    }

    #[test]
    fn rate_lists() {
        let rates = parse_rates("1gbit,3gbit").unwrap();
        assert_eq!(rates.iter().map(|r| r.bits_per_sec()).collect::<Vec<_>>(), [1_000_000_000, 3_000_000_000]);
        assert_eq!(format_rates(&rates), "1gbit,3gbit");
        assert_eq!(parse_rates("2gbit").unwrap().len(), 1);
        assert!(parse_rates("1gbit,").is_err());
        assert!(parse_rates("").is_err());
    }

    #[test]
    fn serde_as_string() {
        let rate: Rate = "2gbit".parse().unwrap();
        assert_eq!(serde_json::to_string(&rate).unwrap(), "\"2gbit\"");
        assert_eq!(serde_json::from_str::<Rate>("\"2gbit\"").unwrap(), rate);
    }
}
