//! Byte sizes as people write them: `8`, `64K`, `1M`, `4MiB`, `2G`.
//! Suffixes are binary (K = 1024), as in the OSU benchmarks and MPI knobs.
//! And rates, in bits or bytes per second: [`parse_rate`].

/// Parses a byte size. Accepts an integer with an optional suffix
/// `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB` (all powers of 1024,
/// case-insensitive) or `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("'{s}' is not a size (expected e.g. 8, 64K, 4M)"));
    }
    let n: u64 = num.parse().map_err(|_| format!("'{s}': number too large"))?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("'{s}': unknown size suffix '{other}' (use K, M or G)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("'{s}': size too large"))
}

/// Formats a byte size compactly with a binary suffix when exact (`64K`).
pub fn format_size(n: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{}", n >> shift, suffix);
        }
    }
    n.to_string()
}

/// Decimal prefixes of rate units (any case) and the binary ones.
const RATE_PREFIXES: &[(&str, u128)] = &[
    ("", 1),
    ("k", 1_000),
    ("m", 1_000_000),
    ("g", 1_000_000_000),
    ("t", 1_000_000_000_000),
    ("ki", 1 << 10),
    ("mi", 1 << 20),
    ("gi", 1 << 30),
    ("ti", 1 << 40),
];

/// Most digits after the point in a rate (`1.000000001gbit` is one bit
/// more than 1gbit).
const RATE_FRACTION_DIGITS: u32 = 12;

/// What a rate may look like, for messages.
const RATE_HINT: &str = "write bits as 2gbit, 500mbit, 10Gbit/s or 1gibit, bytes as 4GB/s, 500MB/s or 1GiB/s";

/// Parses a rate into bits per second, exactly (truncated to a whole
/// bit). The one rate syntax of multirail: `testbed --rate`, `@RATE` in
/// rail specs, `rate=` in MULTIRAIL_FAULTS, `model` and `bench --model`.
///
/// * bits: `bit`, `kbit`, `mbit`, `gbit`, `tbit` and the binary `kibit`,
///   `mibit`, `gibit`, `tibit`, in any case, optionally with `/s`
///   (`2gbit`, `10Gbit/s`); `bps` is bits too (as rail specs read it);
/// * bytes: `B/s`, `kB/s` (or `KB/s`), `MB/s`, `GB/s`, `TB/s` and the
///   binary `KiB/s`, `MiB/s`, `GiB/s`, `TiB/s`: a capital `B` and `/s`;
/// * decimal prefixes are powers of 1000, `Ki`/`Mi`/`Gi`/`Ti` of 1024.
///
/// Refused, saying why (the reason; the caller names the input and where
/// it came from): `kbps`/`Mbps`/`Gbps` (bits to some tools, bytes to
/// `tc`), a bare number (bits or bytes?), a lowercase `b/s`, a byte unit
/// without `/s` (`4GB` is a size), zero, exponents, signs.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bits = scale_decimal(number, rate_unit_bits(unit)?)?;
    match u64::try_from(bits) {
        Ok(0) => Err("a rate must be more than zero".into()),
        Ok(b) => Ok(b),
        Err(_) => Err("rate too large".into()),
    }
}

/// Bits per second in one `unit`, or why it is refused.
fn rate_unit_bits(unit: &str) -> Result<u128, String> {
    let prefix = |p: &str| RATE_PREFIXES.iter().find(|(name, _)| name.eq_ignore_ascii_case(p)).map(|&(_, s)| s);
    let unknown = || format!("unknown prefix in '{unit}': {RATE_HINT}");
    let lower = unit.to_ascii_lowercase();
    if lower.is_empty() {
        return Err(format!("no unit: bits or bytes? {RATE_HINT}"));
    }
    if lower == "bps" {
        return Ok(1);
    }
    let bits = lower.strip_suffix("/s").unwrap_or(&lower);
    if let Some(p) = bits.strip_suffix("bit") {
        return prefix(p).ok_or_else(unknown);
    }
    if lower.ends_with("bps") {
        return Err(format!("'{unit}' is ambiguous (bits to some tools, bytes per second to tc): {RATE_HINT}"));
    }
    if let Some(p) = unit.strip_suffix("B/s") {
        return prefix(p).map(|s| s * 8).ok_or_else(unknown);
    }
    if unit.ends_with("b/s") {
        return Err(format!("'{unit}': a lowercase b is ambiguous: {RATE_HINT}"));
    }
    if unit.ends_with('B') {
        return Err(format!("'{unit}' is a size, not a rate: add /s (4GB/s)"));
    }
    Err(format!("unknown unit '{unit}': {RATE_HINT}"))
}

/// `number × scale`, computed exactly and truncated to an integer.
fn scale_decimal(number: &str, scale: u128) -> Result<u128, String> {
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(format!("expected a number first: {RATE_HINT}"));
    }
    if frac_part.contains('.') {
        return Err("more than one decimal point".into());
    }
    let frac_digits = frac_part.len() as u32;
    if frac_digits > RATE_FRACTION_DIGITS {
        return Err(format!("at most {RATE_FRACTION_DIGITS} digits after the point"));
    }
    let mantissa: u128 = format!("{int_part}{frac_part}").parse().map_err(|_| "rate too large".to_string())?;
    let scaled = mantissa.checked_mul(scale).ok_or("rate too large")?;
    Ok(scaled / 10u128.pow(frac_digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_bits_and_bytes() {
        let bits = |s: &str| parse_rate(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bits("2gbit"), 2_000_000_000);
        assert_eq!(bits("2Gbit/s"), 2_000_000_000);
        assert_eq!(bits("1.5gbit"), 1_500_000_000);
        assert_eq!(bits(".5mbit"), 500_000);
        assert_eq!(bits("1.000000001gbit"), 1_000_000_001, "exact");
        assert_eq!(bits("1kibit"), 1024);
        assert_eq!(bits("8gibit"), 8 << 30);
        assert_eq!(bits("1000bps"), 1000, "bps is bits, as rail specs read it");
        assert_eq!(bits("4GB/s"), 32_000_000_000);
        assert_eq!(bits("500MB/s"), 4_000_000_000);
        assert_eq!(bits("12kB/s"), 96_000);
        assert_eq!(bits("12KB/s"), 96_000);
        assert_eq!(bits("1GiB/s"), 8 << 30);
        assert_eq!(bits(" 100B/s "), 800);
    }

    #[test]
    fn rate_errors_say_why() {
        let why = |s: &str| parse_rate(s).unwrap_err();
        assert!(why("10Gbps").contains("ambiguous") && why("100Mbps").contains("mbit"), "{}", why("10Gbps"));
        assert!(why("10gb/s").contains("lowercase b"), "{}", why("10gb/s"));
        assert!(why("800").contains("no unit"), "{}", why("800"));
        assert!(why("4GB").contains("a size, not a rate"), "{}", why("4GB"));
        assert!(why("0gbit").contains("more than zero") && why("0.0GB/s").contains("more than zero"));
        assert!(why("1.2.3gbit").contains("decimal point"));
        assert!(why("1.0000000000001gbit").contains("digits after the point"));
        assert!(why("99999999999999999999tbit").contains("too large"));
        for s in ["", "gbit", "-1gbit", "1e9B/s", "2 gbit", "2xbit", "2QB/s", "inf", "NaN", "2gbit/h", "."] {
            assert!(parse_rate(s).is_err(), "{s:?} should be refused");
        }
    }
    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64kib"), Ok(65536));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size(" 2 GB "), Ok(2 << 30));
        assert!(parse_size("K").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("9999999999999T").is_err());
    }
    #[test]
    fn format() {
        assert_eq!(format_size(65536), "64K");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(4 << 20), "4M");
        assert_eq!(parse_size(&format_size(3 << 30)), Ok(3 << 30));
    }
}
