//! Parsers for the text of proxy-init's flags: Go's integers and booleans, port lists with
//! ranges, CIDR lists. Each takes the text as pflag hands it to proxy-init.

use std::fmt;

use ipnet::IpNet;

use super::LinkerdError;
use crate::engine::spec::PortRange;

/// The entries of a list flag: every occurrence's value split on commas, entries not trimmed
/// (pflag's CSV reading keeps blanks: `" 22"` is an entry, and not a port). An empty value is
/// no entry at all (`--inbound-ports-to-ignore ''`), an empty entry between commas is one.
pub(crate) fn entries(values: &[String]) -> impl Iterator<Item = &str> {
    values
        .iter()
        .filter(|value| !value.is_empty())
        .flat_map(|value| value.split(','))
}

/// One port as Go's `strconv.Atoi` plus proxy-init's range check read it: decimal, an
/// optional `+`, 0-65535.
fn port(text: &str) -> Option<u16> {
    text.parse().ok()
}

/// An ignore-list entry: a port (`4190`) or an inclusive range (`4190-4191`), as
/// proxy-init's `ParsePortRange`.
pub(crate) fn port_entry(text: &str) -> Result<PortRange, PortEntryProblem> {
    let mut bounds = text.split('-');
    let lower_text = bounds.next().unwrap_or_default();
    let upper_text = bounds.next().unwrap_or(lower_text);
    if bounds.next().is_some() {
        return Err(PortEntryProblem::NotARange);
    }
    let lower =
        port(lower_text).ok_or_else(|| PortEntryProblem::LowerBound(lower_text.to_owned()))?;
    let upper =
        port(upper_text).ok_or_else(|| PortEntryProblem::UpperBound(upper_text.to_owned()))?;
    PortRange::new(lower, upper).ok_or(PortEntryProblem::Reversed)
}

/// `--inbound-ports-to-ignore` / `--outbound-ports-to-ignore`: every entry that parses, in
/// the order given, and the entries that do not, which proxy-init logs and leaves out.
pub(crate) fn port_ranges(
    flag: &'static str,
    values: &[String],
) -> (Vec<PortRange>, Vec<DroppedEntry>) {
    let mut ranges = Vec::new();
    let mut dropped = Vec::new();
    for entry in entries(values) {
        match port_entry(entry) {
            Ok(range) => ranges.push(range),
            Err(problem) => dropped.push(DroppedEntry::new(flag, entry, problem)),
        }
    }
    (ranges, dropped)
}

/// `-r/--ports-to-redirect`: single ports; entries that do not parse are dropped like the
/// ignore lists' (proxy-init would fail on them; one bad entry should not leave a pod
/// without its proxy).
pub(crate) fn ports(flag: &'static str, values: &[String]) -> (Vec<u16>, Vec<DroppedEntry>) {
    let mut ports = Vec::new();
    let mut dropped = Vec::new();
    for entry in entries(values) {
        match port(entry) {
            Some(port) => ports.push(port),
            None => dropped.push(DroppedEntry::new(flag, entry, PortEntryProblem::Port)),
        }
    }
    (ports, dropped)
}

/// `--subnets-to-ignore`: entries are trimmed, as proxy-init does before `net.ParseCIDR`,
/// and must carry a prefix length; host bits are cleared (`10.1.2.3/8` is `10.0.0.0/8`).
/// IPv4 and IPv6 entries mix freely: each applies to its own family.
pub(crate) fn subnets(values: &[String]) -> Result<Vec<IpNet>, LinkerdError> {
    entries(values)
        .map(|entry| {
            let entry = entry.trim();
            entry
                .parse::<IpNet>()
                .map(|net| net.trunc())
                .map_err(|_| LinkerdError::InvalidCidr {
                    value: entry.to_owned(),
                })
        })
        .collect()
}

/// A list entry left out because it does not parse; the command logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedEntry {
    /// The flag the entry was given in, e.g. `--inbound-ports-to-ignore`.
    pub flag: &'static str,
    /// The entry exactly as given, blanks included.
    pub entry: String,
    pub problem: PortEntryProblem,
}

impl DroppedEntry {
    fn new(flag: &'static str, entry: &str, problem: PortEntryProblem) -> Self {
        DroppedEntry {
            flag,
            entry: entry.to_owned(),
            problem,
        }
    }
}

impl fmt::Display for DroppedEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid port configuration of {:?} in {}: {}; the entry is ignored",
            self.entry, self.flag, self.problem
        )
    }
}

/// Why a port entry does not parse (proxy-init's reasons).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum PortEntryProblem {
    #[error("not a port (0-65535)")]
    Port,
    #[error("ranges expected as <lower>-<upper>")]
    NotARange,
    #[error("{0:?} is not a valid lower-bound")]
    LowerBound(String),
    #[error("{0:?} is not a valid upper-bound")]
    UpperBound(String),
    #[error("upper-bound must be greater than or equal to lower-bound")]
    Reversed,
}
