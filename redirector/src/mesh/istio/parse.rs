//! Parsers for the text of one setting. Each names the offending part of the text when it
//! rejects it; the caller adds where the text came from.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};
use redirector_common::maps::{MAX_IFACES, MAX_OWNERS};

use crate::mesh::common::{duration::parse_go_duration, go};

use super::{CidrSelection, InterceptionMode, PortSelection, Problem};

/// A value a parser refused: the offending text (one list entry, or the whole list) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejected {
    pub value: String,
    pub problem: Problem,
}

impl Rejected {
    fn new(value: &str, problem: Problem) -> Self {
        Rejected {
            value: value.to_owned(),
            problem,
        }
    }
}

type Parsed<T> = Result<T, Rejected>;

const WILDCARD: &str = "*";

/// The entries of a comma list. Empty entries are dropped as istio's `Split` does, and blanks
/// around entries too, so "15090,15021,15020,", ",80" and "80, 81" all work.
pub(crate) fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
}

/// Whether the list is exactly `*`.
pub(crate) fn is_wildcard(text: &str) -> bool {
    let mut list = entries(text);
    list.next() == Some(WILDCARD) && list.next().is_none()
}

/// A port 1-65535, digits only (no sign).
pub(crate) fn port(text: &str) -> Parsed<u16> {
    let text = text.trim();
    digits(text)
        .and_then(|d| d.parse::<u16>().ok())
        .filter(|&port| port != 0)
        .ok_or_else(|| Rejected::new(text, Problem::Port))
}

/// A list of ports (`-d`, `-q`, `-o`): `*` means nothing here.
pub(crate) fn port_list(text: &str) -> Parsed<Vec<u16>> {
    entries(text)
        .map(|entry| not_wildcard(entry).and_then(port))
        .collect()
}

/// `-b`: empty → no inbound capture, `*` → every port, else a port list.
pub(crate) fn inbound_ports(text: &str) -> Parsed<PortSelection> {
    if entries(text).next().is_none() {
        return Ok(PortSelection::None);
    }
    if is_wildcard(text) {
        return Ok(PortSelection::All);
    }
    entries(text)
        .map(|entry| not_in_list(text, entry).and_then(port))
        .collect::<Parsed<_>>()
        .map(PortSelection::List)
}

/// An unsigned 32-bit number (`-t`, `-r`).
pub(crate) fn integer(text: &str) -> Parsed<u32> {
    let text = text.trim();
    digits(text)
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| Rejected::new(text, Problem::Integer))
}

/// `-u` / `-g`: numeric ids, at most as many as the kernel side holds.
pub(crate) fn ids(text: &str) -> Parsed<Vec<u32>> {
    let ids = entries(text)
        .map(|entry| {
            digits(entry)
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| Rejected::new(entry, Problem::NumericId))
        })
        .collect::<Parsed<Vec<u32>>>()?;
    within_owner_capacity(text, ids)
}

/// Owner groups: numbers as they are, names through `group_gid`, at most as many as the kernel
/// side holds.
pub(crate) fn group_ids(text: &str, group_gid: impl Fn(&str) -> Option<u32>) -> Parsed<Vec<u32>> {
    let gids = entries(text)
        .map(|entry| {
            not_in_list(text, entry)?;
            match digits(entry) {
                Some(d) => d
                    .parse()
                    .map_err(|_| Rejected::new(entry, Problem::NumericId)),
                None => group_gid(entry).ok_or_else(|| Rejected::new(entry, Problem::UnknownGroup)),
            }
        })
        .collect::<Parsed<Vec<u32>>>()?;
    within_owner_capacity(text, gids)
}

/// `-i`: empty → no outbound capture, `*` → every destination, else a CIDR list.
pub(crate) fn outbound_cidrs(text: &str) -> Parsed<CidrSelection> {
    if entries(text).next().is_none() {
        return Ok(CidrSelection::None);
    }
    if is_wildcard(text) {
        return Ok(CidrSelection::All);
    }
    entries(text)
        .map(|entry| not_in_list(text, entry).and_then(cidr))
        .collect::<Parsed<_>>()
        .map(CidrSelection::List)
}

/// `-x`: a CIDR list; `*` would exclude everything, which istio rejects.
pub(crate) fn cidr_list(text: &str) -> Parsed<Vec<IpNet>> {
    entries(text)
        .map(|entry| not_wildcard(entry).and_then(cidr))
        .collect()
}

/// A CIDR, or a bare address as a host route (iptables takes both). Host bits are cleared so
/// `10.0.0.1/8` means `10.0.0.0/8`, as iptables reads it.
pub(crate) fn cidr(text: &str) -> Parsed<IpNet> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| Rejected::new(text, Problem::Cidr))
}

/// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: an IPv4 loopback range of /8 to /32, as istio validates it.
pub(crate) fn loopback_v4_cidr(text: &str) -> Parsed<Ipv4Net> {
    let text = text.trim();
    match cidr(text) {
        Ok(IpNet::V4(net)) if net.addr().is_loopback() && (8..=32).contains(&net.prefix_len()) => {
            Ok(net)
        }
        _ => Err(Rejected::new(text, Problem::LoopbackCidr)),
    }
}

/// `-c` / `-k`: Linux interface names (at most IFNAMSIZ - 1 bytes, as `dev_valid_name` accepts).
pub(crate) fn interface_names(text: &str) -> Parsed<Vec<String>> {
    let names: Vec<String> = entries(text)
        .map(|name| {
            let valid = name.len() <= 15
                && name != "."
                && name != ".."
                && !name
                    .chars()
                    .any(|c| c == '/' || c == ':' || c.is_whitespace());
            if valid {
                Ok(name.to_owned())
            } else {
                Err(Rejected::new(name, Problem::InterfaceName))
            }
        })
        .collect::<Parsed<_>>()?;
    if names.len() > MAX_IFACES {
        return Err(Rejected::new(
            text,
            Problem::TooManyEntries {
                max: MAX_IFACES,
                got: names.len(),
            },
        ));
    }
    Ok(names)
}

/// `-m`: empty means REDIRECT; names are upper case only, as istio compares them.
pub(crate) fn interception_mode(text: &str) -> Parsed<InterceptionMode> {
    match text.trim() {
        "" | "REDIRECT" => Ok(InterceptionMode::Redirect),
        "TPROXY" => Ok(InterceptionMode::Tproxy),
        other => Err(Rejected::new(other, Problem::InterceptionMode)),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it.
pub(crate) fn go_bool(text: &str) -> Parsed<bool> {
    go::parse_bool(text).ok_or_else(|| Rejected::new(text, Problem::Bool))
}

/// A Go duration (`5s`, `500ms`, `1m30s`); negative durations make no sense as a timeout.
pub(crate) fn duration(text: &str) -> Parsed<std::time::Duration> {
    let text = text.trim();
    parse_go_duration(text).ok_or_else(|| Rejected::new(text, Problem::Duration))
}

fn digits(text: &str) -> Option<&str> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then_some(text)
}

fn not_wildcard(entry: &str) -> Parsed<&str> {
    if entry == WILDCARD {
        Err(Rejected::new(entry, Problem::WildcardNotAllowed))
    } else {
        Ok(entry)
    }
}

/// `*` is only meaningful alone; in a list it is rejected with the whole list as the value.
fn not_in_list<'a>(list: &str, entry: &'a str) -> Parsed<&'a str> {
    if entry == WILDCARD {
        Err(Rejected::new(list, Problem::WildcardInList))
    } else {
        Ok(entry)
    }
}

fn within_owner_capacity(text: &str, ids: Vec<u32>) -> Parsed<Vec<u32>> {
    if ids.len() > MAX_OWNERS {
        return Err(Rejected::new(
            text,
            Problem::TooManyEntries {
                max: MAX_OWNERS,
                got: ids.len(),
            },
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn rejected(value: &str, problem: Problem) -> Rejected {
        Rejected::new(value, problem)
    }

    #[test]
    fn entries_skip_blanks_and_stray_commas() {
        assert_eq!(
            entries("15090,15021,15020,").collect::<Vec<_>>(),
            ["15090", "15021", "15020"]
        );
        assert_eq!(entries(",80").collect::<Vec<_>>(), ["80"]);
        assert_eq!(entries("80, 81 ,,").collect::<Vec<_>>(), ["80", "81"]);
        assert_eq!(entries("").count(), 0);
        assert_eq!(entries(" , ").count(), 0);
    }

    #[test]
    fn ports_are_1_to_65535() {
        assert_eq!(port("1"), Ok(1));
        assert_eq!(port("65535"), Ok(65535));
        assert_eq!(port(" 15001 "), Ok(15001));
        for bad in [
            "0",
            "65536",
            "70000",
            "abc",
            "",
            "-1",
            "+80",
            "80.0",
            "99999999999999999999",
        ] {
            assert_eq!(port(bad), Err(rejected(bad, Problem::Port)), "{bad:?}");
        }
    }

    #[test]
    fn port_lists_name_the_bad_entry() {
        assert_eq!(
            port_list("15090,15021,15020,"),
            Ok(vec![15090, 15021, 15020])
        );
        assert_eq!(port_list(""), Ok(vec![]));
        assert_eq!(port_list("80,0"), Err(rejected("0", Problem::Port)));
        assert_eq!(
            port_list("80,*"),
            Err(rejected("*", Problem::WildcardNotAllowed))
        );
    }

    #[test]
    fn inbound_ports_none_all_or_list() {
        assert_eq!(inbound_ports(""), Ok(PortSelection::None));
        assert_eq!(inbound_ports(" , "), Ok(PortSelection::None));
        assert_eq!(inbound_ports("*"), Ok(PortSelection::All));
        assert_eq!(inbound_ports(" * ,"), Ok(PortSelection::All));
        assert_eq!(
            inbound_ports("32000,31000"),
            Ok(PortSelection::List(vec![32000, 31000]))
        );
        assert_eq!(
            inbound_ports("80,*"),
            Err(rejected("80,*", Problem::WildcardInList))
        );
        assert_eq!(inbound_ports("80,x"), Err(rejected("x", Problem::Port)));
    }

    #[test]
    fn integers_are_u32() {
        assert_eq!(integer("4294967295"), Ok(u32::MAX));
        assert_eq!(
            integer("4294967296"),
            Err(rejected("4294967296", Problem::Integer))
        );
        assert_eq!(integer("-1"), Err(rejected("-1", Problem::Integer)));
    }

    #[test]
    fn ids_are_numeric_and_at_most_max_owners() {
        assert_eq!(ids("3,4"), Ok(vec![3, 4]));
        assert_eq!(ids(""), Ok(vec![]));
        assert_eq!(ids("1,2,3,4,5,6,7,8"), Ok((1..=8).collect()));
        assert_eq!(
            ids("1,2,3,4,5,6,7,8,9"),
            Err(rejected(
                "1,2,3,4,5,6,7,8,9",
                Problem::TooManyEntries { max: 8, got: 9 }
            ))
        );
        assert_eq!(
            ids("1337,istio-proxy"),
            Err(rejected("istio-proxy", Problem::NumericId))
        );
    }

    #[test]
    fn group_ids_resolve_names() {
        let lookup = |name: &str| (name == "java").then_some(1001);
        assert_eq!(group_ids("java,202", lookup), Ok(vec![1001, 202]));
        assert_eq!(
            group_ids("nosuch", lookup),
            Err(rejected("nosuch", Problem::UnknownGroup))
        );
        assert_eq!(
            group_ids("java,*", lookup),
            Err(rejected("java,*", Problem::WildcardInList))
        );
    }

    #[test]
    fn cidrs_accept_bare_addresses_and_clear_host_bits() {
        assert_eq!(cidr("10.0.0.0/8"), Ok(net("10.0.0.0/8")));
        assert_eq!(cidr("10.0.0.1/8"), Ok(net("10.0.0.0/8")));
        assert_eq!(cidr("1.2.3.4"), Ok(net("1.2.3.4/32")));
        assert_eq!(cidr("2001:db8::1"), Ok(net("2001:db8::1/128")));
        assert_eq!(cidr("2001:db8::1/32"), Ok(net("2001:db8::/32")));
        for bad in ["10.0.0.0/33", "10.0.0", "bogus", "::/129", ""] {
            assert_eq!(cidr(bad), Err(rejected(bad, Problem::Cidr)), "{bad:?}");
        }
    }

    #[test]
    fn outbound_cidrs_none_all_or_list() {
        assert_eq!(outbound_cidrs(""), Ok(CidrSelection::None));
        assert_eq!(outbound_cidrs("*"), Ok(CidrSelection::All));
        assert_eq!(
            outbound_cidrs("10.0.0.0/8, 2001:db8::/32,"),
            Ok(CidrSelection::List(vec![
                net("10.0.0.0/8"),
                net("2001:db8::/32")
            ]))
        );
        assert_eq!(
            outbound_cidrs("*,10.0.0.0/8"),
            Err(rejected("*,10.0.0.0/8", Problem::WildcardInList))
        );
    }

    #[test]
    fn exclude_cidrs_reject_the_wildcard() {
        assert_eq!(cidr_list(""), Ok(vec![]));
        assert_eq!(cidr_list("1.1.0.0/16"), Ok(vec![net("1.1.0.0/16")]));
        assert_eq!(
            cidr_list("*"),
            Err(rejected("*", Problem::WildcardNotAllowed))
        );
    }

    #[test]
    fn loopback_cidr_must_be_ipv4_loopback_8_to_32() {
        assert_eq!(
            loopback_v4_cidr("127.0.0.1/32"),
            Ok("127.0.0.1/32".parse().unwrap())
        );
        assert_eq!(
            loopback_v4_cidr("127.0.0.1/8"),
            Ok("127.0.0.0/8".parse().unwrap())
        );
        for bad in ["127.0.0.0/7", "10.0.0.1/32", "::1/128", "nope"] {
            assert_eq!(
                loopback_v4_cidr(bad),
                Err(rejected(bad, Problem::LoopbackCidr)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn interface_names_follow_linux_rules() {
        assert_eq!(
            interface_names("eth1,eth2,"),
            Ok(vec!["eth1".to_owned(), "eth2".to_owned()])
        );
        assert_eq!(
            interface_names("not-istio-nic"),
            Ok(vec!["not-istio-nic".to_owned()])
        );
        assert_eq!(interface_names("abcdefghijklmno").map(|v| v.len()), Ok(1));
        for bad in ["abcdefghijklmnop", "a/b", "eth0:1", "..", "a\tb"] {
            assert_eq!(
                interface_names(bad),
                Err(rejected(bad, Problem::InterfaceName)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn interception_modes() {
        assert_eq!(interception_mode(""), Ok(InterceptionMode::Redirect));
        assert_eq!(
            interception_mode("REDIRECT"),
            Ok(InterceptionMode::Redirect)
        );
        assert_eq!(interception_mode("TPROXY"), Ok(InterceptionMode::Tproxy));
        assert_eq!(
            interception_mode("tproxy"),
            Err(rejected("tproxy", Problem::InterceptionMode))
        );
    }

    #[test]
    fn booleans_follow_go() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(go_bool(yes), Ok(true), "{yes:?}");
        }
        for no in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(go_bool(no), Ok(false), "{no:?}");
        }
        for bad in ["yes", "no", "2", "on", "", "tRuE", " true"] {
            assert_eq!(go_bool(bad), Err(rejected(bad, Problem::Bool)), "{bad:?}");
        }
    }
}
