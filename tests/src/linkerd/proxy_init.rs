//! Linkerd's `proxy-init`: its command line and the nat rules it writes, as
//! `iptables-restore` input — the reference side of the Linkerd conformance suite.
//!
//! Written from linkerd2-proxy-init at commit 183e791 (the rule generation of the
//! `proxy-init/v2.4.9` tag linkerd2 ships): `proxy-init/cmd/root.go` (flags, validation, one
//! IPv4 pass and, with `--ipv6`, one IPv6 pass with the same options) and
//! `pkg/iptables/iptables.go` (chains, rule order, comments, multiport chunks of at most 15
//! port references). proxy-init runs one `iptables -t nat -A …` per rule; the same rules in
//! one `iptables-restore` input end in the same tables, and the lines here are written as
//! `iptables-save` prints them, so a test can compare what was loaded with what was meant.
//!
//! ```text
//! *nat
//! :PROXY_INIT_OUTPUT - [0:0]                     outbound, first match wins:
//! :PROXY_INIT_REDIRECT - [0:0]                   1. owner uid / gid (each only if > 0)
//! -A PREROUTING … -j PROXY_INIT_REDIRECT          2. -o lo
//! -A OUTPUT … -j PROXY_INIT_OUTPUT                3. --outbound-ports-to-ignore (multiport)
//! -A PROXY_INIT_OUTPUT …                          4. REDIRECT --to-ports <outgoing>
//! -A PROXY_INIT_REDIRECT …                       inbound: ignored ports, source subnets,
//! COMMIT                                           REDIRECT all (or only the -r ports)
//! ```
//!
//! One deliberate difference: proxy-init gives both passes the whole `--subnets-to-ignore` list, so
//! with `--ipv6=true` any CIDR fails the pass of the other family (exit 1,
//! docs/linkerd.md#where-behaviour-differs-from-proxy-inits-iptables-rules, a defect redirector
//! improves on). Each family's rules here keep only the CIDRs of that family: what proxy-init
//! writes when the list holds only that family's.

use std::net::IpAddr;

use clap::{ArgAction, Parser};
use ipnet::IpNet;

use crate::scenario::Family;

pub const OUTPUT_CHAIN: &str = "PROXY_INIT_OUTPUT";
pub const REDIRECT_CHAIN: &str = "PROXY_INIT_REDIRECT";
/// Port references (a single port counts 1, a range 2) per `-m multiport` rule.
pub const MULTIPORT_LIMIT: usize = 15;

/// Why proxy-init would refuse a command line (exit 1), or why this model does not cover it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyInitError {
    /// A command line proxy-init's flags refuse: a flag it does not have, or one the suite
    /// does not model (`--simulate`), a missing value, or one not among a flag's choices.
    #[error("{0}")]
    Usage(String),
    #[error("invalid value {value:?} for {flag}")]
    InvalidValue { flag: String, value: String },
    /// `--incoming-proxy-port` / `--outgoing-proxy-port` outside 0..=65535 (or unset).
    #[error("{flag} must be a valid TCP port number (got {value})")]
    InvalidProxyPort { flag: &'static str, value: i64 },
    /// proxy-init: `"<s> is not a valid CIDR address"`.
    #[error("{0} is not a valid CIDR address")]
    InvalidCidr(String),
    /// A non-empty ignore list none of whose entries parses: proxy-init still writes a
    /// multiport rule, with `--dports ""`, which iptables refuses.
    #[error("{flag}: no entry is a port or range; proxy-init writes `--dports \"\"`, which iptables refuses")]
    NoValidPort { flag: &'static str },
}

/// An inclusive port range from an ignore list (`4190` or `1000-2000`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
}

impl PortRange {
    /// proxy-init's parse (`util.ParsePortRange`): one bound or two joined by `-`, each a
    /// decimal (Go's `Atoi`: an optional sign, digits, nothing else) in 0..=65535, lower
    /// not above upper. An entry that fails is logged and dropped by proxy-init.
    pub fn parse(entry: &str) -> Option<Self> {
        let mut bounds = entry.split('-');
        let lo = atoi_port(bounds.next()?)?;
        let hi = match bounds.next() {
            Some(hi) => atoi_port(hi)?,
            None => lo,
        };
        (bounds.next().is_none() && lo <= hi).then_some(PortRange { lo, hi })
    }

    pub fn contains(self, port: u16) -> bool {
        (self.lo..=self.hi).contains(&port)
    }

    /// As multiport writes it: `4190` or `1000:2000`.
    fn multiport(self) -> String {
        if self.lo == self.hi {
            self.lo.to_string()
        } else {
            format!("{}:{}", self.lo, self.hi)
        }
    }

    /// How many of multiport's 15 references it takes.
    fn references(self) -> usize {
        if self.lo == self.hi {
            1
        } else {
            2
        }
    }
}

/// Go's `strconv.Atoi` restricted to a TCP port (0..=65535).
fn atoi_port(s: &str) -> Option<u16> {
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Leading zeros are fine for Atoi; anything longer than 5 significant digits is out of
    // range (and would overflow the parse below).
    let significant = digits.trim_start_matches('0');
    if significant.len() > 5 {
        return None;
    }
    let value: u32 = if significant.is_empty() {
        0
    } else {
        significant.parse().ok()?
    };
    u16::try_from(value).ok()
}

/// A `--subnets-to-ignore` entry, checked as Go's `net.ParseCIDR` checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredSubnet {
    /// As given (trimmed): proxy-init's comment carries it like this.
    pub text: String,
    /// The network, host bits cleared.
    pub net: IpNet,
}

impl IgnoredSubnet {
    pub fn parse(entry: &str) -> Result<Self, ProxyInitError> {
        let text = entry.trim();
        let invalid = || ProxyInitError::InvalidCidr(text.to_owned());
        let (addr, prefix) = text.split_once('/').ok_or_else(invalid)?;
        // Go takes decimal digits only (no sign), which u8's parse would let through.
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        let addr: IpAddr = addr.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        let net = IpNet::new(addr, prefix).map_err(|_| invalid())?.trunc();
        Ok(IgnoredSubnet {
            text: text.to_owned(),
            net,
        })
    }

    pub fn family(&self) -> Family {
        match self.net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.net.contains(&ip)
    }
}

/// Which inbound connections are redirected once the ignore rules have passed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboundMode {
    /// No `-r`: every TCP port.
    RedirectAll,
    /// `-r p1,p2,…`: only these destination ports.
    RedirectListed(Vec<u16>),
}

/// What proxy-init was asked to do, from its command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyInitOptions {
    pub incoming_proxy_port: u16,
    pub outgoing_proxy_port: u16,
    /// `-u`; exempts its sockets only when > 0.
    pub proxy_uid: Option<i64>,
    /// `-g`; exempts its sockets only when > 0.
    pub proxy_gid: Option<i64>,
    pub inbound: InboundMode,
    /// The entries that parse; proxy-init logs and drops the others.
    pub inbound_ports_to_ignore: Vec<PortRange>,
    pub outbound_ports_to_ignore: Vec<PortRange>,
    pub subnets_to_ignore: Vec<IgnoredSubnet>,
    /// `--ipv6` (default true): also write the IPv6 rules.
    pub ipv6: bool,
}

impl ProxyInitOptions {
    /// Parses proxy-init's command line (see [`Flags`]) and checks it as proxy-init does.
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Self, ProxyInitError> {
        let flags = Flags::try_parse_from(args.iter().map(AsRef::as_ref)).map_err(|e| {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or_default();
            ProxyInitError::Usage(first.trim_start_matches("error: ").to_owned())
        })?;
        flags.validate()
    }

    /// The nat table proxy-init leaves for `family` as `iptables-restore` input.
    pub fn nat_rules(&self, family: Family) -> String {
        let mut output = Vec::new();
        let uid = self.proxy_uid.filter(|u| *u > 0);
        let gid = self.proxy_gid.filter(|g| *g > 0);
        if let Some(uid) = uid {
            output.push(format!(
                "-m owner --uid-owner {uid} {} -j RETURN",
                comment("ignore-proxy-user-id")
            ));
        }
        if let Some(gid) = gid {
            output.push(format!(
                "-m owner --gid-owner {gid} {} -j RETURN",
                comment("ignore-proxy-group-id")
            ));
        }
        output.push(format!("-o lo {} -j RETURN", comment("ignore-loopback")));
        output.extend(ignore_ports(&self.outbound_ports_to_ignore));
        output.push(format!(
            "-p tcp {} -j REDIRECT --to-ports {}",
            comment("redirect-all-outgoing-to-proxy-port"),
            self.outgoing_proxy_port
        ));

        let mut redirect = ignore_ports(&self.inbound_ports_to_ignore);
        for subnet in self
            .subnets_to_ignore
            .iter()
            .filter(|s| s.family() == family)
        {
            redirect.push(format!(
                "-s {} {} -j RETURN",
                subnet.net,
                comment(&format!("ignore-subnet-{}", subnet.text))
            ));
        }
        match &self.inbound {
            InboundMode::RedirectAll => redirect.push(format!(
                "-p tcp {} -j REDIRECT --to-ports {}",
                comment("redirect-all-incoming-to-proxy-port"),
                self.incoming_proxy_port
            )),
            InboundMode::RedirectListed(ports) => redirect.extend(ports.iter().map(|port| {
                format!(
                    "-p tcp -m tcp --dport {port} {} -j REDIRECT --to-ports {}",
                    comment(&format!("redirect-port-{port}-to-proxy-port")),
                    self.incoming_proxy_port
                )
            })),
        }

        let mut text = String::from(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
             :POSTROUTING ACCEPT [0:0]\n",
        );
        text.push_str(&format!(
            ":{OUTPUT_CHAIN} - [0:0]\n:{REDIRECT_CHAIN} - [0:0]\n"
        ));
        text.push_str(&format!(
            "-A PREROUTING {} -j {REDIRECT_CHAIN}\n",
            comment("install-proxy-init-prerouting")
        ));
        text.push_str(&format!(
            "-A OUTPUT {} -j {OUTPUT_CHAIN}\n",
            comment("install-proxy-init-output")
        ));
        for rule in output {
            text.push_str(&format!("-A {OUTPUT_CHAIN} {rule}\n"));
        }
        for rule in redirect {
            text.push_str(&format!("-A {REDIRECT_CHAIN} {rule}\n"));
        }
        text.push_str("COMMIT\n");
        text
    }

    /// The socket owners whose connections are never redirected.
    pub fn exempts(&self, uid: u32, gid: u32) -> bool {
        self.proxy_uid.is_some_and(|u| u > 0 && u == i64::from(uid))
            || self.proxy_gid.is_some_and(|g| g > 0 && g == i64::from(gid))
    }
}

/// `-m comment --comment "proxy-init/<text>"`.
fn comment(text: &str) -> String {
    format!("-m comment --comment \"proxy-init/{text}\"")
}

/// The RETURN rules for an ignore list: multiport rules of at most [`MULTIPORT_LIMIT`]
/// references, in list order, a new rule started when the next entry does not fit.
fn ignore_ports(ranges: &[PortRange]) -> Vec<String> {
    let mut chunks: Vec<Vec<PortRange>> = Vec::new();
    let mut used = 0;
    for range in ranges {
        if chunks.is_empty() || used + range.references() > MULTIPORT_LIMIT {
            chunks.push(Vec::new());
            used = 0;
        }
        chunks.last_mut().expect("pushed above").push(*range);
        used += range.references();
    }
    chunks
        .iter()
        .map(|chunk| {
            let dports: Vec<String> = chunk.iter().map(|r| r.multiport()).collect();
            let dports = dports.join(",");
            format!(
                "-p tcp -m multiport --dports {dports} {} -j RETURN",
                comment(&format!("ignore-port-{dports}"))
            )
        })
        .collect()
}

/// proxy-init's command line as its flag library (pflag) reads it: `--flag value`,
/// `--flag=value`, `-f value`, `-f=value`, `-fvalue`; bool flags only as `--flag` or
/// `--flag=bool`; a repeated flag's last value wins, a list flag's repeats append. The
/// plumbing flags (`--netns`, the iptables mode and binaries, logging,
/// `--timeout-close-wait-secs`, `-w`) are taken and change no rule.
#[derive(Parser)]
#[command(
    no_binary_name = true,
    args_override_self = true,
    disable_help_flag = true
)]
struct Flags {
    #[arg(short = 'p', long, allow_negative_numbers = true)]
    incoming_proxy_port: Option<i64>,
    #[arg(short = 'o', long, allow_negative_numbers = true)]
    outgoing_proxy_port: Option<i64>,
    #[arg(short = 'u', long, allow_negative_numbers = true)]
    proxy_uid: Option<i64>,
    #[arg(short = 'g', long, allow_negative_numbers = true)]
    proxy_gid: Option<i64>,
    /// The lists as given, each comma-separated.
    #[arg(short = 'r', long, action = ArgAction::Append)]
    ports_to_redirect: Vec<String>,
    #[arg(long, action = ArgAction::Append)]
    inbound_ports_to_ignore: Vec<String>,
    #[arg(long, action = ArgAction::Append)]
    outbound_ports_to_ignore: Vec<String>,
    #[arg(long, action = ArgAction::Append)]
    subnets_to_ignore: Vec<String>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    ipv6: Option<bool>,
    #[arg(short = 'w', long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    use_wait_flag: Option<bool>,
    #[arg(long, value_parser = ["", "legacy", "nft", "plain"])]
    iptables_mode: Option<String>,
    #[arg(long, value_parser = ["", "iptables-legacy", "iptables-nft", "iptables"])]
    firewall_bin_path: Option<String>,
    #[arg(long)]
    firewall_save_bin_path: Option<String>,
    #[arg(long)]
    netns: Option<String>,
    #[arg(long)]
    log_level: Option<String>,
    #[arg(long)]
    log_format: Option<String>,
    #[arg(long)]
    timeout_close_wait_secs: Option<String>,
}

/// A list flag's entries: its values split at commas (pflag's string slices; `""` is none).
fn entries(values: &[String]) -> Vec<&str> {
    values
        .iter()
        .filter(|v| !v.is_empty())
        .flat_map(|v| v.split(','))
        .collect()
}

impl Flags {
    fn validate(self) -> Result<ProxyInitOptions, ProxyInitError> {
        let port = |flag: &'static str, value: Option<i64>| {
            let value = value.unwrap_or(-1);
            u16::try_from(value).map_err(|_| ProxyInitError::InvalidProxyPort { flag, value })
        };
        let ranges = |values: &[String], flag: &'static str| {
            let entries = entries(values);
            let ranges: Vec<PortRange> =
                entries.iter().filter_map(|e| PortRange::parse(e)).collect();
            if ranges.is_empty() && !entries.is_empty() {
                Err(ProxyInitError::NoValidPort { flag })
            } else {
                Ok(ranges)
            }
        };
        let redirect = entries(&self.ports_to_redirect)
            .into_iter()
            .map(|p| {
                p.parse().map_err(|_| ProxyInitError::InvalidValue {
                    flag: "--ports-to-redirect".into(),
                    value: p.to_owned(),
                })
            })
            .collect::<Result<Vec<u16>, _>>()?;
        Ok(ProxyInitOptions {
            incoming_proxy_port: port("--incoming-proxy-port", self.incoming_proxy_port)?,
            outgoing_proxy_port: port("--outgoing-proxy-port", self.outgoing_proxy_port)?,
            proxy_uid: self.proxy_uid,
            proxy_gid: self.proxy_gid,
            inbound: if redirect.is_empty() {
                InboundMode::RedirectAll
            } else {
                InboundMode::RedirectListed(redirect)
            },
            inbound_ports_to_ignore: ranges(
                &self.inbound_ports_to_ignore,
                "--inbound-ports-to-ignore",
            )?,
            outbound_ports_to_ignore: ranges(
                &self.outbound_ports_to_ignore,
                "--outbound-ports-to-ignore",
            )?,
            subnets_to_ignore: entries(&self.subnets_to_ignore)
                .into_iter()
                .map(IgnoredSubnet::parse)
                .collect::<Result<_, _>>()?,
            ipv6: self.ipv6.unwrap_or(true),
        })
    }
}

/// Go's `strconv.ParseBool`.
fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a Go bool")),
    }
}

/// The nat rules a pod is left with after proxy-init ran with each of `runs` in turn: a run
/// flushes and refills the chains of the families it touches (IPv4 always, IPv6 with
/// `--ipv6`) and leaves the other family's as they were.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureState {
    /// The options in force per family: IPv4 those of the last run, IPv6 those of the last
    /// run with `--ipv6`, if any (none: IPv6 is not captured).
    pub v4: ProxyInitOptions,
    pub v6: Option<ProxyInitOptions>,
}

impl CaptureState {
    pub fn after(runs: &[ProxyInitOptions]) -> Self {
        let v4 = runs.last().expect("at least one run").clone();
        let v6 = runs.iter().rev().find(|o| o.ipv6).cloned();
        CaptureState { v4, v6 }
    }

    pub fn of(&self, family: Family) -> Option<&ProxyInitOptions> {
        match family {
            Family::V4 => Some(&self.v4),
            Family::V6 => self.v6.as_ref(),
        }
    }
}

/// Every `-A` line of a restore input or of `iptables-save` output, grouped by chain in
/// order: what two rule sets are compared by (chain declarations, counters and comments of
/// the save format left out).
pub fn rules_by_chain(text: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut chains = std::collections::BTreeMap::<String, Vec<String>>::new();
    for line in text.lines().map(str::trim) {
        if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or("").to_owned();
            chains.entry(chain).or_default().push(line.to_owned());
        }
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The injector's command line (docs/linkerd.md#how-linkerd-runs-it), IPv6 off.
    const INJECTOR: &str = "--firewall-bin-path iptables-nft --firewall-save-bin-path \
        iptables-nft-save --ipv6=false --incoming-proxy-port 4143 --outgoing-proxy-port 4140 \
        --proxy-uid 2102 --inbound-ports-to-ignore 4190,4191,4567,4568 \
        --outbound-ports-to-ignore 4567,4568";

    /// proxy-init's options from a command line written as one string.
    fn parse(line: &str) -> Result<ProxyInitOptions, ProxyInitError> {
        ProxyInitOptions::parse(&crate::words(line))
    }

    #[test]
    fn injector_defaults_give_proxy_init_s_rules() {
        let opts = parse(INJECTOR).unwrap();
        assert!(!opts.ipv6);
        assert_eq!(
            opts.nat_rules(Family::V4),
            "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 4567,4568 -m comment --comment \"proxy-init/ignore-port-4567,4568\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191,4567,4568 -m comment --comment \"proxy-init/ignore-port-4190,4191,4567,4568\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
COMMIT
"
        );
        let state = CaptureState::after(&[opts]);
        assert!(state.v6.is_none(), "--ipv6=false leaves IPv6 alone");
    }

    #[test]
    fn ranges_split_into_multiport_rules_of_fifteen_references() {
        // 7 ranges (14 references) and two single ports: the second single port opens a
        // second rule.
        let opts = parse(
            "-p 4143 -o 4140 --outbound-ports-to-ignore 1-2,3-4,5-6,7-8,9-10,11-12,13-14,15,16",
        )
        .unwrap();
        let rules = opts.nat_rules(Family::V4);
        let multiport: Vec<&str> = rules.lines().filter(|l| l.contains("multiport")).collect();
        assert_eq!(multiport.len(), 2, "{rules}");
        assert!(
            multiport[0].contains("--dports 1:2,3:4,5:6,7:8,9:10,11:12,13:14,15 "),
            "{rules}"
        );
        assert!(
            multiport[1].contains("--dports 16 -m comment --comment \"proxy-init/ignore-port-16\"")
        );
        // No owner rule without -u/-g.
        assert!(!rules.contains("owner"), "{rules}");
    }

    #[test]
    fn bad_port_entries_are_dropped_and_bad_cidrs_refused() {
        let opts = ProxyInitOptions::parse(&[
            "-p=4143",
            "-o4140",
            "--inbound-ports-to-ignore",
            "abc,70000,25-23, 22,0,4190",
            "--inbound-ports-to-ignore=1000-2000",
        ])
        .unwrap();
        assert_eq!(
            opts.inbound_ports_to_ignore,
            [
                PortRange { lo: 0, hi: 0 },
                PortRange { lo: 4190, hi: 4190 },
                PortRange { lo: 1000, hi: 2000 }
            ]
        );
        assert!(opts.ipv6, "--ipv6 defaults to true");
        assert_eq!(
            parse("-p 1 -o 2 --subnets-to-ignore 10.0.0.1"),
            Err(ProxyInitError::InvalidCidr("10.0.0.1".into()))
        );
        assert!(matches!(
            parse("-o 4140"),
            Err(ProxyInitError::InvalidProxyPort { value: -1, .. })
        ));
        assert!(matches!(
            parse("-p 1 -o 2 --outbound-ports-to-ignore x"),
            Err(ProxyInitError::NoValidPort { .. })
        ));
        assert!(matches!(
            parse("-p 1 -o 2 --iptables-mode fancy"),
            Err(ProxyInitError::Usage(_))
        ));
    }

    #[test]
    fn listed_ports_subnets_and_owners() {
        let opts =
            parse("-p 4143 -o 4140 -u 0 -g 2103 -r 8080,4190 --subnets-to-ignore 192.0.2.9/24,2001:db8::/32")
                .unwrap();
        let v4 = opts.nat_rules(Family::V4);
        assert!(!v4.contains("--uid-owner"), "uid 0 exempts nobody:\n{v4}");
        assert!(v4.contains("-m owner --gid-owner 2103 "), "{v4}");
        assert!(v4.contains(
            "-A PROXY_INIT_REDIRECT -s 192.0.2.0/24 -m comment --comment \"proxy-init/ignore-subnet-192.0.2.9/24\" -j RETURN"
        ));
        assert!(!v4.contains("2001:db8"), "{v4}");
        assert!(v4.contains(
            "-A PROXY_INIT_REDIRECT -p tcp -m tcp --dport 4190 -m comment --comment \"proxy-init/redirect-port-4190-to-proxy-port\" -j REDIRECT --to-ports 4143"
        ));
        assert!(!v4.contains("redirect-all-incoming"), "{v4}");
        let v6 = opts.nat_rules(Family::V6);
        assert!(v6.contains("-s 2001:db8::/32 "), "{v6}");
        assert!(!v6.contains("192.0.2"), "{v6}");
        assert!(opts.exempts(1000, 2103) && !opts.exempts(0, 0) && !opts.exempts(2102, 2102));
        let subnet = &opts.subnets_to_ignore[0];
        assert!(subnet.contains("192.0.2.200".parse().unwrap()));
        assert!(!subnet.contains("192.0.3.1".parse().unwrap()));
    }

    #[test]
    fn a_rerun_keeps_the_ipv6_rules_of_the_last_run_that_wrote_them() {
        let on = parse("-p 4143 -o 4140 -u 2102").unwrap();
        let off = parse("-p 4143 -o 4141 --ipv6=false").unwrap();
        let state = CaptureState::after(&[on.clone(), off.clone()]);
        assert_eq!(state.v4, off);
        assert_eq!(state.v6, Some(on));
    }

    #[test]
    fn rules_group_by_chain() {
        let text = "*nat\n-A A x\n-A B y\n-A A z\nCOMMIT\n";
        let chains = rules_by_chain(text);
        assert_eq!(chains["A"], ["-A A x", "-A A z"]);
        assert_eq!(chains["B"], ["-A B y"]);
    }
}
