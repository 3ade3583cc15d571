//! Byte sizes as people write them: `8`, `64K`, `1M`, `4MiB`, `2G`.
//! Suffixes are binary (K = 1024), as in the OSU benchmarks and MPI knobs.

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
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{}", n >> shift, suffix);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
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
