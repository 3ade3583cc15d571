//! The multi-rail bandwidth model of Cai, Rendell and Strazdins,
//! "Non-threaded and Threaded Approaches to MultiRail Communication with
//! uDAPL" (NPC 2009), for `multirail model` and `bench bw --model`.
//!
//! A rail's data crosses three things, each with its own top speed: the
//! host bus into the NIC's slot (`host`), the NIC's own bus (`nic`) and
//! the link (`link`). With `N` rails:
//!
//! * **multi-HCA** (N NICs, one port each, each NIC in its own slot):
//!   `N · min(link, nic, host)` — every rail has its own path.
//! * **multi-port** (one NIC with N ports): `min(N · link, nic, host)` —
//!   the links add up, but all of them share one NIC and one slot.
//!
//! The paper's cluster (IB 4x DDR links of 2 GB/s, PCIe 1.1 NICs of
//! 2 GB/s, PCIe 2.0 x16 host slots of 4 GB/s, two rails) predicts 4 GB/s
//! multi-HCA and 2 GB/s multi-port.
//!
//! Rails of different speeds generalise both formulas the obvious way:
//! multi-HCA is `Σ min(link_i, nic, host)`, multi-port
//! `min(Σ link_i, nic, host)`. An absent `nic` or `host` is no limit.
//!
//! Rates are bytes per second; [`parse_rate`] reads `2gbit`, `10Gbit/s`,
//! `4GB/s`, `500MB/s` (decimal: G = 10^9; bits are `bit`, bytes are `B/s`)
//! in multirail's one rate syntax, [`multirail_proto::units::parse_rate`].

use std::fmt;

use serde::Serialize;

/// Why a rate or a model input was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("'{input}' is not a rate: {reason}")]
    InvalidRate { input: String, reason: String },
    #[error("no rails: the model needs at least one")]
    NoRails,
    #[error("{links} link rates for {rails} rails: give one rate (every rail) or one per rail")]
    LinkCount { links: usize, rails: usize },
}

/// Parses a rate into bytes per second, in multirail's one rate syntax
/// ([`multirail_proto::units::parse_rate`]): bits as `2gbit`, `10Gbit/s`,
/// bytes as `4GB/s`, `500MB/s`; `Ki`/`Mi`/`Gi`/`Ti` are binary.
pub fn parse_rate(text: &str) -> Result<f64, ModelError> {
    let bits = multirail_proto::units::parse_rate(text)
        .map_err(|reason| ModelError::InvalidRate { input: text.to_string(), reason })?;
    Ok(bits as f64 / 8.0)
}

/// A rate in bytes per second as people read it: `2 GB/s (16 Gbit/s)`.
pub struct ShowRate(pub f64);

impl fmt::Display for ShowRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", decimal(self.0, "B/s"), decimal(self.0 * 8.0, "bit/s"))
    }
}

/// `x` with the largest decimal prefix that keeps it at least 1:
/// `2 GB/s`, `937.5 MB/s`, `1.23 Gbit/s`.
fn decimal(x: f64, unit: &str) -> String {
    let (v, p) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(s, _)| x >= *s)
        .map_or((x, ""), |(s, p)| (x / s, p));
    let digits = format!("{v:.3}");
    let digits = digits.trim_end_matches('0').trim_end_matches('.');
    format!("{digits} {p}{unit}")
}

/// What the model is given: the rails' link rates and the two buses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInput {
    /// Each rail's link rate, bytes/s.
    pub links: Vec<f64>,
    /// The NIC's bus (PCIe of the NIC), bytes/s; `None`: no limit.
    pub nic: Option<f64>,
    /// The host's bus (the slot the NIC sits in), bytes/s; `None`: no limit.
    pub host: Option<f64>,
}

/// The two predictions, bytes/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    pub multi_hca: f64,
    pub multi_port: f64,
}

impl ModelInput {
    /// `rails` rails with `links` (one rate for all, or one per rail).
    pub fn new(rails: usize, links: &[f64], nic: Option<f64>, host: Option<f64>) -> Result<ModelInput, ModelError> {
        if rails == 0 {
            return Err(ModelError::NoRails);
        }
        let links = match links.len() {
            1 => vec![links[0]; rails],
            n if n == rails => links.to_vec(),
            n => return Err(ModelError::LinkCount { links: n, rails }),
        };
        Ok(ModelInput { links, nic, host })
    }

    fn bus(&self) -> f64 {
        self.nic.unwrap_or(f64::INFINITY).min(self.host.unwrap_or(f64::INFINITY))
    }

    /// Both predictions.
    pub fn predict(&self) -> Prediction {
        let bus = self.bus();
        let multi_hca = self.links.iter().map(|l| l.min(bus)).sum();
        let multi_port = self.links.iter().sum::<f64>().min(bus);
        Prediction { multi_hca, multi_port }
    }

    /// The two explaining lines of `multirail model`, each ending in a
    /// newline.
    pub fn explain(&self) -> String {
        let p = self.predict();
        let n = self.links.len();
        let same = self.links.iter().all(|l| *l == self.links[0]);
        let link = if same { decimal(self.links[0], "B/s") } else { self.links_list() };
        let buses = self.buses_text();
        let (hca, port) = if same {
            (format!("{n} × min(link {link}{buses})"), format!("min({n} × link {link}{buses})"))
        } else if buses.is_empty() {
            (format!("Σ links {link}"), format!("Σ links {link}"))
        } else {
            (format!("Σ min(link_i{buses}) over links {link}"), format!("min(Σ links {link}{buses})"))
        };
        format!(
            "multi-HCA  ({n} NICs, one port each): {hca} = {}; {}\n\
             multi-port (one NIC, {n} ports):      {port} = {}; {}\n",
            ShowRate(p.multi_hca),
            self.hca_limit(),
            ShowRate(p.multi_port),
            self.port_limit(p.multi_port),
        )
    }

    fn links_list(&self) -> String {
        let v: Vec<String> = self.links.iter().map(|l| decimal(*l, "B/s")).collect();
        format!("[{}]", v.join(", "))
    }

    fn buses_text(&self) -> String {
        let mut s = String::new();
        if let Some(n) = self.nic {
            s.push_str(&format!(", NIC bus {}", decimal(n, "B/s")));
        }
        if let Some(h) = self.host {
            s.push_str(&format!(", host bus {}", decimal(h, "B/s")));
        }
        s
    }

    /// What bounds each rail of the multi-HCA setup.
    fn hca_limit(&self) -> String {
        let bus = self.bus();
        match self.links.iter().filter(|l| **l > bus).count() {
            0 => "each rail runs at its link rate".into(),
            k if k == self.links.len() => format!("each rail is held to the {}", self.bus_name()),
            k => format!("{k} of {} rails are held to the {}", self.links.len(), self.bus_name()),
        }
    }

    fn port_limit(&self, multi_port: f64) -> String {
        if multi_port < self.links.iter().sum::<f64>() {
            format!("the {} holds the links back", self.bus_name())
        } else {
            "the links add up".into()
        }
    }

    /// The slower bus's name.
    fn bus_name(&self) -> &'static str {
        match (self.nic, self.host) {
            (Some(n), Some(h)) if h < n => "host bus",
            (Some(_), _) => "NIC bus",
            (None, Some(_)) => "host bus",
            (None, None) => "bus",
        }
    }
}

/// The model beside measurements (`bench bw --model`): the predictions and
/// where the link rates came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelColumns {
    pub input: ModelInput,
    pub prediction: Prediction,
    /// `measured: one bw run per rail at 4M` or `given: --link`.
    pub links_from: String,
}

impl ModelColumns {
    pub fn new(input: ModelInput, links_from: impl Into<String>) -> ModelColumns {
        ModelColumns { prediction: input.predict(), input, links_from: links_from.into() }
    }

    /// Multi-HCA and multi-port predictions in MB/s (MB = 10^6 bytes).
    pub fn megabytes_per_sec(&self) -> (f64, f64) {
        (self.prediction.multi_hca / 1e6, self.prediction.multi_port / 1e6)
    }

    /// `measured / predicted` for both predictions, `measured` in MB/s.
    pub fn ratios(&self, measured: f64) -> (f64, f64) {
        let (hca, port) = self.megabytes_per_sec();
        (measured / hca, measured / port)
    }

    /// A `# `-prefixed line naming the inputs and both predictions.
    pub fn header_line(&self) -> String {
        let mb = |x: f64| format!("{:.2}", x / 1e6);
        let links: Vec<String> = self.input.links.iter().map(|l| mb(*l)).collect();
        let bus = |b: Option<f64>| b.map_or("no limit".to_string(), mb);
        format!(
            "# model (NPC'09), MB/s: links [{}] ({}), NIC bus {}, host bus {} -> multi-HCA {}, multi-port {}\n",
            links.join(", "),
            self.links_from,
            bus(self.input.nic),
            bus(self.input.host),
            mb(self.prediction.multi_hca),
            mb(self.prediction.multi_port),
        )
    }
}

/// `multirail model --json`: the inputs and both predictions, bytes/s.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReport {
    pub rails: usize,
    /// Each rail's link rate.
    pub link: Vec<f64>,
    pub nic: Option<f64>,
    pub host: Option<f64>,
    pub multi_hca: f64,
    pub multi_port: f64,
    pub unit: &'static str,
}

impl ModelReport {
    pub fn new(input: &ModelInput) -> ModelReport {
        let p = input.predict();
        ModelReport {
            rails: input.links.len(),
            link: input.links.clone(),
            nic: input.nic,
            host: input.host,
            multi_hca: p.multi_hca,
            multi_port: p.multi_port,
            unit: "bytes/s",
        }
    }

    /// One line of JSON.
    pub fn json(&self) -> String {
        crate::report::json::to_line(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> f64 {
        parse_rate(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn npc09_cluster() {
        // Cai et al., NPC'09: IB 4x DDR 2 GB/s, PCIe 1.1 NIC 2 GB/s, PCIe 2.0
        // x16 host 4 GB/s: "Bottleneck for Multi-HCA is 4GB/s, for
        // Multi-port is 2GB/s".
        let m = ModelInput::new(2, &[rate("2GB/s")], Some(rate("2GB/s")), Some(rate("4GB/s"))).unwrap();
        assert_eq!(m.predict(), Prediction { multi_hca: 4e9, multi_port: 2e9 });
    }

    #[test]
    fn each_bound_in_turn() {
        let g = 1e9;
        // Links bound both.
        let m = ModelInput::new(2, &[g], Some(10.0 * g), Some(10.0 * g)).unwrap();
        assert_eq!(m.predict(), Prediction { multi_hca: 2.0 * g, multi_port: 2.0 * g });
        // The host bus bounds each HCA and the port setup.
        let m = ModelInput::new(4, &[3.0 * g], Some(8.0 * g), Some(2.0 * g)).unwrap();
        assert_eq!(m.predict(), Prediction { multi_hca: 8.0 * g, multi_port: 2.0 * g });
        // No buses: links add up either way.
        let m = ModelInput::new(3, &[g], None, None).unwrap();
        assert_eq!(m.predict(), Prediction { multi_hca: 3.0 * g, multi_port: 3.0 * g });
        // One rail: both are min(link, nic, host).
        let m = ModelInput::new(1, &[5.0 * g], Some(4.0 * g), None).unwrap();
        assert_eq!(m.predict(), Prediction { multi_hca: 4.0 * g, multi_port: 4.0 * g });
    }

    #[test]
    fn rails_of_different_speeds() {
        let g = 1e9;
        let m = ModelInput::new(2, &[g, 3.0 * g], Some(2.0 * g), None).unwrap();
        // min(1,2) + min(3,2) = 3; min(1+3, 2) = 2.
        assert_eq!(m.predict(), Prediction { multi_hca: 3.0 * g, multi_port: 2.0 * g });
        assert_eq!(ModelInput::new(3, &[g, g], None, None), Err(ModelError::LinkCount { links: 2, rails: 3 }));
        assert_eq!(ModelInput::new(0, &[g], None, None), Err(ModelError::NoRails));
    }

    #[test]
    fn rates_in_bits_and_bytes() {
        assert_eq!(rate("2gbit"), 250e6);
        assert_eq!(rate("2Gbit"), 250e6);
        assert_eq!(rate("10Gbit/s"), 1.25e9);
        assert_eq!(rate("500mbit"), 62.5e6);
        assert_eq!(rate("64kbit/s"), 8e3);
        assert_eq!(rate("800bit"), 100.0);
        assert_eq!(rate("4GB/s"), 4e9);
        assert_eq!(rate("500MB/s"), 500e6);
        assert_eq!(rate("1.5GB/s"), 1.5e9);
        assert_eq!(rate("1.5gB/s"), 1.5e9);
        assert_eq!(rate("12kB/s"), 12e3);
        assert_eq!(rate("100B/s"), 100.0);
        assert_eq!(rate("1TB/s"), 1e12);
        assert_eq!(rate(" .5GB/s "), 0.5e9);
        assert_eq!(rate("1GiB/s"), 1073741824.0);
        assert_eq!(rate("8gibit"), 1073741824.0);
    }

    #[test]
    fn rate_errors_say_why() {
        let why = |s: &str| parse_rate(s).unwrap_err().to_string();
        assert!(why("10Gbps").contains("ambiguous"), "{}", why("10Gbps"));
        assert!(why("10gb/s").contains("lowercase b"), "{}", why("10gb/s"));
        assert!(why("4GB").contains("a size, not a rate"), "{}", why("4GB"));
        assert!(why("0gbit").contains("more than zero"));
        assert!(why("0.0GB/s").contains("more than zero"));
        assert!(why("1.2.3gbit").contains("decimal point"));
        for s in ["", "gbit", "-1gbit", "1e9B/s", "2 gbit", "2xbit", "2QB/s", "inf", "NaN", "2gbit/h", "."] {
            assert!(parse_rate(s).is_err(), "{s:?} should be refused");
        }
        assert_eq!(
            why("3furlongs"),
            "'3furlongs' is not a rate: unknown unit 'furlongs': write bits as 2gbit, 500mbit, 10Gbit/s or 1gibit, \
             bytes as 4GB/s, 500MB/s or 1GiB/s"
        );
    }

    #[test]
    fn shown_rates() {
        assert_eq!(ShowRate(2e9).to_string(), "2 GB/s (16 Gbit/s)");
        assert_eq!(ShowRate(937.5e6).to_string(), "937.5 MB/s (7.5 Gbit/s)");
        assert_eq!(ShowRate(100.0).to_string(), "100 B/s (800 bit/s)");
    }

    #[test]
    fn explanation_names_the_bottleneck() {
        let m = ModelInput::new(2, &[2e9], Some(2e9), Some(4e9)).unwrap();
        let text = m.explain();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            "multi-HCA  (2 NICs, one port each): 2 × min(link 2 GB/s, NIC bus 2 GB/s, host bus 4 GB/s) \
             = 4 GB/s (32 Gbit/s); each rail runs at its link rate"
        );
        assert_eq!(
            lines[1],
            "multi-port (one NIC, 2 ports):      min(2 × link 2 GB/s, NIC bus 2 GB/s, host bus 4 GB/s) \
             = 2 GB/s (16 Gbit/s); the NIC bus holds the links back"
        );
        let mixed = ModelInput::new(2, &[1e9, 3e9], None, Some(2e9)).unwrap().explain();
        assert!(mixed.contains("Σ min(link_i, host bus 2 GB/s) over links [1 GB/s, 3 GB/s] = 3 GB/s"), "{mixed}");
        assert!(mixed.contains("1 of 2 rails are held to the host bus"), "{mixed}");
    }

    #[test]
    fn columns_beside_measurements() {
        let m = ModelInput::new(2, &[100e6, 300e6], None, Some(350e6)).unwrap();
        let c = ModelColumns::new(m, "given: --link");
        assert_eq!(c.megabytes_per_sec(), (400.0, 350.0));
        assert_eq!(c.ratios(200.0), (0.5, 200.0 / 350.0));
        assert_eq!(
            c.header_line(),
            "# model (NPC'09), MB/s: links [100.00, 300.00] (given: --link), NIC bus no limit, \
             host bus 350.00 -> multi-HCA 400.00, multi-port 350.00\n"
        );
    }

    #[test]
    fn json_report() {
        let m = ModelInput::new(2, &[2e9], Some(2e9), Some(4e9)).unwrap();
        assert_eq!(
            ModelReport::new(&m).json(),
            "{\"rails\":2,\"link\":[2000000000.0,2000000000.0],\"nic\":2000000000.0,\"host\":4000000000.0,\
             \"multi_hca\":4000000000.0,\"multi_port\":2000000000.0,\"unit\":\"bytes/s\"}\n"
        );
    }
}
