//! The reference rule sets of the conformance cases: istio's golden files, adapted only where
//! the test machine or topology requires it. Every adaptation is a small text edit with the
//! istio source it follows named beside it (istio/istio `tools/istio-iptables/pkg/capture/
//! run.go`), and the ones that can be checked against other golden files are (see the tests
//! and `tests/tests/conformance.rs`).

use std::ffi::CString;
use std::net::Ipv4Addr;

use crate::iptables::{append_rules, golden};

/// istio's IPv4 loopback CIDR default (`ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`).
pub const DEFAULT_LOOPBACK_V4: &str = "127.0.0.1/32";

/// The rule that `-i '*'` adds (`handleOutboundIncludeRules`, wildcard branch), as in
/// `kube-virt-interfaces.golden`.
pub const CAPTURE_ALL: &str = "-A ISTIO_OUTPUT -j ISTIO_REDIRECT";

/// Where a rule set's IPv6 section comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V6Origin {
    /// The golden file's own IPv6 section (generated with IPv6 on).
    Golden,
    /// Derived from the IPv4 section with [`derive_v6`]: the golden file was generated with
    /// IPv6 off, but the test pod has an IPv6 address, so istio-iptables would switch IPv6
    /// on ("IPv6 is switched on when the pod has a non-loopback IPv6 address").
    Derived,
}

/// The `iptables-restore` and `ip6tables-restore` inputs of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    pub v4: String,
    pub v6: String,
    pub v6_origin: V6Origin,
}

impl RuleSet {
    /// A golden file; its IPv6 section, or one derived from its IPv4 section.
    pub fn golden(case: &str, loopback_v4: &str) -> Self {
        let (v4, v6) = golden(case);
        match v6 {
            Some(v6) => RuleSet {
                v4,
                v6,
                v6_origin: V6Origin::Golden,
            },
            None => RuleSet {
                v6: derive_v6(&v4, loopback_v4),
                v4,
                v6_origin: V6Origin::Derived,
            },
        }
    }

    /// The same edit applied to both sections.
    pub fn map(self, edit: impl Fn(&str) -> String) -> Self {
        RuleSet {
            v4: edit(&self.v4),
            v6: edit(&self.v6),
            v6_origin: self.v6_origin,
        }
    }

    /// Adds `-i '*'`: [`CAPTURE_ALL`] at the end of ISTIO_OUTPUT in both families.
    pub fn with_capture_all(self) -> Self {
        self.map(|s| append_rules(s, "nat", &[CAPTURE_ALL]))
    }
}

/// Whether `token` is an IPv4 address or CIDR.
fn is_v4_token(token: &str) -> bool {
    token
        .split('/')
        .next()
        .is_some_and(|a| a.parse::<Ipv4Addr>().is_ok())
}

/// Whether `token` is an IPv6 address or CIDR.
fn is_v6_token(token: &str) -> bool {
    token
        .split('/')
        .next()
        .is_some_and(|a| a.contains(':') && a.parse::<std::net::Ipv6Addr>().is_ok())
}

/// The IPv6 section istio-iptables writes for an IPv4 section, by the rule its rule builder
/// follows: `AppendVersionedRule` rules carry `127.0.0.6/32` → `::6/128` and the IPv4
/// loopback CIDR → `::1/128`; rules with any other IPv4 address are IPv4-only
/// (`AppendRuleV4`: `-x`/`-i` CIDRs and DNS servers, split by family); everything else is
/// written to both families unchanged — except the jumps to the DNS chains, which istio
/// adds per family only when that family has DNS rules (`SetupDNSRedir`), so they go
/// when the IPv4 DNS servers were all the chain had ([`drop_empty_dns_jumps`]).
pub fn derive_v6(v4: &str, loopback_v4: &str) -> String {
    drop_empty_dns_jumps(&map_v4_rules_to_v6(v4, loopback_v4))
}

/// The chains istio jumps to only for a family with DNS servers (or with
/// `--capture-all-dns`): (table, chain, the jump).
const PER_FAMILY_DNS_JUMPS: [(&str, &str, &str); 2] = [
    (
        "nat",
        "ISTIO_OUTPUT_DNS",
        "-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS",
    ),
    ("raw", "ISTIO_INBOUND", "-A PREROUTING -j ISTIO_INBOUND"),
];

/// Without the chain's rules, the jump to it and its declaration go too.
fn drop_empty_dns_jumps(section: &str) -> String {
    let mut out = section.to_owned();
    for (table_name, chain, jump) in PER_FAMILY_DNS_JUMPS {
        let has_rules = table(&out, table_name)
            .lines()
            .any(|line| line.starts_with(&format!("-A {chain} ")));
        if !has_rules {
            let declaration = format!("-N {chain}");
            out = edit_table(&out, table_name, |line| line != declaration && line != jump);
        }
    }
    out
}

/// The `* <name>` … `COMMIT` block of a restore input (empty if there is none).
pub fn table(section: &str, name: &str) -> String {
    filter_lines(section, |table, _| table == Some(name))
}

/// `section` keeping, inside table `name`, only the lines `keep` accepts.
fn edit_table(section: &str, name: &str, keep: impl Fn(&str) -> bool) -> String {
    filter_lines(section, |table, line| table != Some(name) || keep(line))
}

/// The lines of `section` that `keep` accepts, given the table each is in (the last `*<table>`
/// header at or before it), each ending in a newline.
fn filter_lines(section: &str, keep: impl Fn(Option<&str>, &str) -> bool) -> String {
    let mut current = None;
    section
        .lines()
        .filter(|line| {
            if let Some(header) = line.strip_prefix('*') {
                current = Some(header.trim().to_owned());
            }
            keep(current.as_deref(), line)
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// [`derive_v6`]'s address mapping, line by line.
fn map_v4_rules_to_v6(v4: &str, loopback_v4: &str) -> String {
    let mut out = String::new();
    'lines: for line in v4.lines() {
        let mut tokens = Vec::new();
        for token in line.split_whitespace() {
            let token = if token == "127.0.0.6/32" {
                "::6/128"
            } else if token == loopback_v4 {
                "::1/128"
            } else if is_v4_token(token) {
                continue 'lines;
            } else {
                token
            };
            tokens.push(token);
        }
        out.push_str(&tokens.join(" "));
        out.push('\n');
    }
    out
}

/// `v6` without the rules that name an IPv6 address other than `::1`/`::6` (IPv6-only CIDR
/// and DNS rules), the part [`derive_v6`] cannot know; for the cross-check.
pub fn without_v6_only_rules(v6: &str) -> String {
    v6.lines()
        .filter(|line| {
            !line
                .split_whitespace()
                .any(|t| is_v6_token(t) && !matches!(t, "::1/128" | "::6/128"))
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Lines of `section` without those containing any of `needles`.
pub fn drop_lines(section: &str, needles: &[&str]) -> String {
    section
        .lines()
        .filter(|line| !needles.iter().any(|n| line.contains(n)))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Replaces the group name in `--gid-owner <from>` by `<to>`.
pub fn substitute_group(section: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    for line in section.lines() {
        let mut previous = "";
        let tokens: Vec<&str> = line
            .split_whitespace()
            .map(|token| {
                let token = if previous == "--gid-owner" && token == from {
                    to
                } else {
                    token
                };
                previous = token;
                token
            })
            .collect();
        out.push_str(&tokens.join(" "));
        out.push('\n');
    }
    out
}

/// A group of the system's group database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub gid: u32,
}

/// The gid of group `name` (NSS, as iptables' owner match and redirector resolve it).
pub fn gid_by_name(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    // SAFETY: all-zero is a valid `group` to be filled in.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's length.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut group,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(group.gr_gid)
}

/// Group `wanted`, or — when this machine has no such group, so iptables-restore could not
/// load a rule naming it — the first of `stand_ins` that exists. Both runs of a case use the
/// returned name, so the comparison is unaffected.
pub fn existing_group(wanted: &str, stand_ins: &[&str]) -> Group {
    std::iter::once(wanted)
        .chain(stand_ins.iter().copied())
        .find_map(|name| {
            gid_by_name(name).map(|gid| Group {
                name: name.to_owned(),
                gid,
            })
        })
        .unwrap_or_else(|| {
            panic!("neither group {wanted} nor any stand-in of {stand_ins:?} exists here")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derive_maps_loopbacks_and_drops_ipv4_only_rules() {
        let v4 = "* nat\n-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN\n\
                  -A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/8 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT\n\
                  -A ISTIO_OUTPUT -d 127.0.0.1/8 -j RETURN\n\
                  -A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n";
        assert_eq!(
            derive_v6(v4, "127.0.0.1/8"),
            "* nat\n-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN\n\
             -A ISTIO_OUTPUT -o lo ! -d ::1/128 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT\n\
             -A ISTIO_OUTPUT -d ::1/128 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n"
        );
    }

    #[test]
    fn group_substitution_touches_only_that_group() {
        let line =
            "-A ISTIO_OUTPUT -m owner ! --gid-owner java -m owner ! --gid-owner 202 -j RETURN\n";
        assert_eq!(
            substitute_group(line, "java", "games"),
            "-A ISTIO_OUTPUT -m owner ! --gid-owner games -m owner ! --gid-owner 202 -j RETURN\n"
        );
        assert_eq!(substitute_group(line, "20", "x"), line);
    }

    #[test]
    fn root_group_exists_and_missing_groups_fall_back() {
        assert_eq!(gid_by_name("root"), Some(0));
        assert_eq!(gid_by_name("no-such-group-rdt"), None);
        assert_eq!(
            existing_group("no-such-group-rdt", &["also-missing-rdt", "root"]),
            Group {
                name: "root".into(),
                gid: 0
            }
        );
    }

    #[test]
    fn v6_only_rules_are_recognised() {
        let v6 =
            "-A ISTIO_OUTPUT -d ::1/128 -j RETURN\n-A ISTIO_OUTPUT -d 2001:db8::/32 -j RETURN\n";
        assert_eq!(
            without_v6_only_rules(v6),
            "-A ISTIO_OUTPUT -d ::1/128 -j RETURN\n"
        );
    }
}
