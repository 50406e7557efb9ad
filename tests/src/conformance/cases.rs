//! The conformance cases: every configuration of istio's golden rule sets (CASES.md) that
//! does not need TPROXY, the standard sidecar injection, and a few cases derived from the
//! golden files where those alone would capture nothing and so could not tell a wrong
//! filter from a right one (docs/conformance.md lists them).

use std::net::{IpAddr, Ipv4Addr};

use crate::conformance::rules::{
    drop_lines, existing_group, substitute_group, Group, RuleSet, V6Origin, CAPTURE_ALL,
    DEFAULT_LOOPBACK_V4,
};
use crate::dns::{DnsMode, DNS_PORT};
use crate::iptables::{append_rules, insert_after, standard_injection};
use crate::redirector::STANDARD_INJECTION;
use crate::scenario::{
    DnsRequest, DnsScenario, Dst, Family, Host, InboundScenario, Scenario, Who, APP_PORT,
    APP_PORTS, LOCAL_DNS_V4, LOCAL_DNS_V6, TUNNEL_PORT,
};
use crate::{golden_dir, words};

/// CASES.md cases that are not run, and why.
pub const SKIPPED_GOLDEN_CASES: [(&str, &str); 3] = [
    ("inbound-ports-tproxy", "TPROXY interception"),
    ("inbound-ports-wildcard-tproxy", "TPROXY interception"),
    ("tproxy", "TPROXY interception (with DNS capture)"),
];

/// The DNS side of a case with `--redirect-dns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsSetup {
    /// The pod's resolv.conf nameservers (istio reads them from /etc/resolv.conf;
    /// redirector gets the same file with `--resolv-conf`).
    pub servers: Vec<IpAddr>,
    /// Who runs the stand-in DNS proxy: the case's first proxy uid and gid, as istio's agent
    /// runs as the proxy user (its upstream queries must pass, and on the iptables side its
    /// replies must match the CT zone rules written for those owners).
    pub proxy_owner: (u32, u32),
}

/// The IPv4 include CIDR of `loopback-include` (the one `loopback-outbound-iprange` uses).
pub const LOOPBACK_INCLUDE: Ipv4Addr = Ipv4Addr::new(127, 1, 2, 3);

/// One configuration, run against istio's rules and against redirector.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    /// The golden file the reference rules come from, if any.
    pub golden: Option<String>,
    /// How the reference rules were made, for the report.
    pub reference: String,
    pub rules: RuleSet,
    /// `redirector istio-iptables` arguments: istio's flags for this case.
    pub flags: Vec<String>,
    /// Env vars for redirector (istio's env-only settings).
    pub env: Vec<(String, String)>,
    /// Clients beyond the standard four.
    pub extra_who: Vec<Who>,
    /// Destinations beyond the standard ones.
    pub extra_dsts: Vec<Dst>,
    /// Adaptations to this machine, for the report.
    pub notes: Vec<String>,
    /// DNS capture: the pod's DNS servers and proxy, and DNS rows.
    pub dns: Option<DnsSetup>,
}

impl Case {
    fn new(name: &str, reference: &str, rules: RuleSet, flags: &[&str]) -> Self {
        Case {
            name: name.to_owned(),
            golden: None,
            reference: reference.to_owned(),
            rules,
            flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            env: Vec::new(),
            extra_who: Vec::new(),
            extra_dsts: Vec::new(),
            notes: Vec::new(),
            dns: None,
        }
    }

    /// A golden case as CASES.md gives it, its flags written as one string ([`words`]).
    fn golden(name: &str, flags: &str) -> Self {
        Self::golden_with_loopback(name, flags, DEFAULT_LOOPBACK_V4)
    }

    fn golden_with_loopback(name: &str, flags: &str, loopback_v4: &str) -> Self {
        let rules = RuleSet::golden(name, loopback_v4);
        let reference = match rules.v6_origin {
            V6Origin::Golden => format!("{name}.golden"),
            V6Origin::Derived => format!("{name}.golden, IPv6 section derived"),
        };
        let mut case = Self::new(name, &reference, rules, &words(flags));
        case.golden = Some(name.to_owned());
        case
    }

    fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    fn who(mut self, who: Who) -> Self {
        self.extra_who.push(who);
        self
    }

    fn dst(mut self, dst: Dst) -> Self {
        self.extra_dsts.push(dst);
        self
    }

    fn note(mut self, note: String) -> Self {
        self.notes.push(note);
        self
    }

    /// A DNS case: resolv.conf names `servers`, the DNS proxy runs as `proxy_owner`.
    fn dns(mut self, servers: &[IpAddr], proxy_owner: (u32, u32)) -> Self {
        self.dns = Some(DnsSetup {
            servers: servers.to_vec(),
            proxy_owner,
        });
        self
    }

    /// Adds `-i '*'` to a golden case: its name gets `+capture-all`, its rules [`CAPTURE_ALL`].
    fn with_capture_all(mut self) -> Self {
        self.name.push_str("+capture-all");
        self.reference
            .push_str(" + the rule -i '*' appends (as in kube-virt-interfaces.golden)");
        self.rules = self.rules.with_capture_all();
        self.flags.extend(["-i".to_owned(), "*".to_owned()]);
        self
    }

    /// Every client of this case.
    pub fn clients(&self) -> Vec<Who> {
        let mut who = vec![
            Who::app(),
            Who::proxy(),
            Who::proxy_gid_only(),
            Who::passthrough(),
        ];
        who.extend(self.extra_who.iter().cloned());
        who
    }

    /// Every destination of this case.
    pub fn destinations(&self) -> Vec<Dst> {
        let mut dsts = Vec::new();
        for family in Family::BOTH {
            for (host, port) in [
                (Host::Service, 80),
                // Not the pod's own tunnel port: istio excludes 15008 only towards `lo`.
                (Host::Service, TUNNEL_PORT),
                (Host::Service, 32000),
                (Host::Service, 8081),
                (Host::Outside, 80),
                (Host::Outside, 32000),
                (Host::Pod, APP_PORT),
                (Host::Pod, TUNNEL_PORT),
                (Host::Loopback, APP_PORT),
            ] {
                dsts.push(Dst::new(host, family, port));
            }
        }
        let other = Host::OtherLoopback(Ipv4Addr::new(127, 0, 0, 2));
        dsts.push(Dst::new(other, Family::V4, APP_PORT));
        dsts.extend(self.extra_dsts.iter().copied());
        dsts
    }

    /// The outbound rows: every client to every destination it can reach.
    pub fn outbound_scenarios(&self) -> Vec<Scenario> {
        let dsts = self.destinations();
        self.clients()
            .into_iter()
            .flat_map(|who| {
                dsts.iter()
                    .filter(|dst| who.reaches(dst))
                    .map(|dst| Scenario {
                        who: who.clone(),
                        dst: *dst,
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The DNS rows (none without [`DnsSetup`]): every client but the passthrough one sends a
    /// query over each [`DnsMode`] to port 53 of the pod's DNS server on `lo`, of the pod's
    /// own address and of the service, in both families; and the app resolves through glibc
    /// (UDP and TCP) and c-ares with the case's resolv.conf.
    pub fn dns_scenarios(&self) -> Vec<DnsScenario> {
        if self.dns.is_none() {
            return Vec::new();
        }
        let mut dsts = Vec::new();
        for family in Family::BOTH {
            for host in [Host::LocalDns, Host::Pod, Host::Service] {
                dsts.push(Dst::new(host, family, DNS_PORT));
            }
        }
        let mut rows: Vec<DnsScenario> = self
            .clients()
            .into_iter()
            .filter(|who| !who.passthrough)
            .flat_map(|who| {
                dsts.iter()
                    .flat_map(|&dst| DnsMode::ALL.map(|mode| DnsRequest::Query { dst, mode }))
                    .map(|request| DnsScenario {
                        who: who.clone(),
                        request,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        for request in [
            DnsRequest::Glibc { tcp: false },
            DnsRequest::Glibc { tcp: true },
            DnsRequest::CAres,
        ] {
            rows.push(DnsScenario {
                who: Who::app(),
                request,
            });
        }
        rows
    }

    /// The inbound rows: a peer connecting to each port the app serves in the pod (which
    /// covers the ports the cases put in `-b` and `-d`, an unlisted port and the tunnel
    /// port), over both families.
    pub fn inbound_scenarios(&self) -> Vec<InboundScenario> {
        Family::BOTH
            .into_iter()
            .flat_map(|family| {
                APP_PORTS.map(|port| InboundScenario {
                    dst: Dst::new(Host::Pod, family, port),
                })
            })
            .collect()
    }
}

/// Who has group `group` as its only group (uid 1000).
fn app_in_group(gid: u32, name: &str) -> Who {
    Who::new(&format!("app:gid{gid}({name})"), crate::APP_UID, gid)
}

/// The clients that matter with `-u 3,4 -g 1,2`: each proxy uid and a process of a proxy
/// gid (1337 is then an ordinary app).
fn uid_gid_clients(case: Case) -> Case {
    case.who(Who::new("uid3", 3, 3))
        .who(Who::new("uid4", 4, 4))
        .who(Who::new("app:gid2", crate::APP_UID, 2))
}

/// The owner-group cases (`outbound-owner-groups[-exclude]` with `prefix` "", or the
/// `ipv6-dns-` ones with `--redirect-dns`), with group names this machine has.
fn owner_group_cases(prefix: &str, flags: &str) -> Vec<Case> {
    let java = existing_group("java", &["games", "users", "staff"]);
    let ftp = existing_group("ftp", &["mail", "news", "uucp"]);
    let stand_in = |wanted: &str, group: &Group| {
        format!(
            "group {wanted} does not exist on this machine (iptables-restore could not load the \
             golden rule): {} (gid {}) stands in for it, in the rules and in the env var",
            group.name, group.gid
        )
    };
    // A golden case whose env var lists a numeric gid and group `wanted` (stood in for by
    // `group`); its clients are in either group.
    let case = |golden: &str, var: &str, value: String, gid: u32, wanted: &str, group: &Group| {
        let mut case = Case::golden(&format!("{prefix}{golden}"), flags)
            .env(var, &value)
            .who(app_in_group(gid, &gid.to_string()))
            .who(app_in_group(group.gid, &group.name));
        if group.name != wanted {
            case.rules = case.rules.map(|s| substitute_group(s, wanted, &group.name));
            case = case.note(stand_in(wanted, group));
        }
        case
    };
    vec![
        case(
            "outbound-owner-groups",
            "ISTIO_OUTBOUND_OWNER_GROUPS",
            format!("{},202", java.name),
            202,
            "java",
            &java,
        ),
        case(
            "outbound-owner-groups-exclude",
            "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
            format!("888,{}", ftp.name),
            888,
            "ftp",
            &ftp,
        ),
    ]
}

/// The CASES.md cases with `--redirect-dns`. Their DNS server is 127.0.0.53 (and
/// ::127.0.0.53 for `dns-uid-gid`); the `ipv6-dns-*` ones have none, so istio switches DNS
/// capture off ("REDIRECT_DNS is set, but CAPTURE_ALL_DNS is false, and no DNS servers
/// provided", capture/run.go) and their golden rules have no DNS rule at all.
fn dns_cases() -> Vec<Case> {
    let v4: IpAddr = LOCAL_DNS_V4.into();
    let v6: IpAddr = LOCAL_DNS_V6.into();
    let uid_gid = "--redirect-dns -g 1,2 -u 3,4";
    let mut cases = vec![
        // A dry run in istio's own test; here its flags are applied.
        uid_gid_clients(Case::golden(
            "ip-range",
            &format!("-x 1.1.0.0/16 -i 9.9.0.0/16 {uid_gid}"),
        ))
        .dns(&[v4], (3, 1)),
        uid_gid_clients(Case::golden(
            "loopback-outbound-iprange",
            &format!("-i 127.1.2.3/32 {uid_gid}"),
        ))
        .dst(Dst::new(
            Host::OtherLoopback(LOOPBACK_INCLUDE),
            Family::V4,
            APP_PORT,
        ))
        .dns(&[v4], (3, 1)),
        uid_gid_clients(Case::golden("dns-uid-gid", uid_gid)).dns(&[v4, v6], (3, 1)),
        uid_gid_clients(Case::golden("ipv6-dns-uid-gid", uid_gid)).dns(&[], (3, 1)),
    ];
    let proxy = (crate::PROXY_UID, crate::PROXY_UID);
    cases.extend(
        owner_group_cases("ipv6-dns-", "--redirect-dns")
            .into_iter()
            .map(|case| case.dns(&[], proxy)),
    );
    cases
}

/// `-i '*' -x 192.0.2.0/24,2001:db8::/32 -o 8081 -q 32000`: the outbound exclusions no
/// golden case has, from `empty.golden` with the rules run.go writes for them: `-o` first in
/// ISTIO_OUTPUT (TCP and UDP, "must be applied before connections back to self are
/// redirected"), then after the loopback RETURN the `-x` RETURNs (per family), the `-q`
/// redirects and the `-i '*'` redirect.
fn outbound_exclusions() -> Case {
    let empty = RuleSet::golden("empty", DEFAULT_LOOPBACK_V4);
    let exclude_port = [
        "-A ISTIO_OUTPUT -p tcp --dport 8081 -j RETURN",
        "-A ISTIO_OUTPUT -p udp --dport 8081 -j RETURN",
    ];
    let build = |section: &str, exclude_cidr: &str| {
        let section = insert_after(section, "-A OUTPUT -j ISTIO_OUTPUT", &exclude_port);
        let exclude_cidr = format!("-A ISTIO_OUTPUT -d {exclude_cidr} -j RETURN");
        let include_port = "-A ISTIO_OUTPUT -p tcp --dport 32000 -j ISTIO_REDIRECT";
        append_rules(&section, "nat", &[&exclude_cidr, include_port, CAPTURE_ALL])
    };
    let rules = RuleSet {
        v4: build(&empty.v4, "192.0.2.0/24"),
        v6: build(&empty.v6, "2001:db8::/32"),
        v6_origin: V6Origin::Derived,
    };
    Case::new(
        "outbound-exclusions",
        "empty.golden + the -o, -x, -q and -i '*' rules of run.go",
        rules,
        &words("-i * -x 192.0.2.0/24,2001:db8::/32 -o 8081 -q 32000"),
    )
    // `-o` comes before the proxy-owner rules: the proxy calling its own pod on an excluded
    // port is not sent to 15006 (nothing serves 8081 in the pod: refused).
    .dst(Dst::new(Host::Pod, Family::V4, 8081))
    .dst(Dst::new(Host::Pod, Family::V6, 8081))
}

/// `-i 127.1.2.3/32` without the DNS options of `loopback-outbound-iprange`: an include
/// CIDR that is a loopback address makes istio leave out the "other owners to lo → RETURN"
/// rules (run.go: `HasLoopBackIP`), so the app's connections to that address are captured.
fn loopback_include() -> Case {
    let lo_returns = [
        "-o lo -m owner ! --uid-owner",
        "-o lo -m owner ! --gid-owner",
    ];
    let rules = RuleSet::golden("empty", DEFAULT_LOOPBACK_V4).map(|s| drop_lines(s, &lo_returns));
    // IPv4 only: istio splits -i by family, and this CIDR has no IPv6 part.
    let include = format!("-A ISTIO_OUTPUT -d {LOOPBACK_INCLUDE}/32 -j ISTIO_REDIRECT");
    let rules = RuleSet {
        v4: append_rules(&rules.v4, "nat", &[&include]),
        ..rules
    };
    let cidr = format!("{LOOPBACK_INCLUDE}/32");
    Case::new(
        "loopback-include",
        "empty.golden without the lo RETURNs (as loopback-outbound-iprange.golden) + the -i rule",
        rules,
        &["-i", &cidr],
    )
    .dst(Dst::new(
        Host::OtherLoopback(LOOPBACK_INCLUDE),
        Family::V4,
        APP_PORT,
    ))
}

/// `-u 3,4 -g 1,2 -i '*'`: `ipv6-uid-gid.golden` without its inbound, `-k` and CIDR rules,
/// plus `-i '*'`, so that the proxy-owner list decides between capture and pass.
fn uid_gid_capture_all() -> Case {
    let golden = RuleSet::golden("ipv6-uid-gid", DEFAULT_LOOPBACK_V4);
    let rules = golden
        .map(|s| {
            drop_lines(
                s,
                &["PREROUTING", "--dport 4000", "--dport 5000", "2001:db8"],
            )
        })
        .with_capture_all();
    uid_gid_clients(Case::new(
        "uid-gid+capture-all",
        "ipv6-uid-gid.golden without its -b/-k/-x/-i rules + the rule -i '*' appends",
        rules,
        &words("-u 3,4 -g 1,2 -i *"),
    ))
}

/// Every case, in the order they run.
pub fn cases() -> Vec<Case> {
    let (v4, v6) = standard_injection();
    let standard = Case::new(
        "standard-injection",
        "CASES.md: inbound-ports-wildcard.golden + -d RETURNs + -i '*' (IPv6 derived)",
        RuleSet {
            v4,
            v6,
            v6_origin: V6Origin::Derived,
        },
        &STANDARD_INJECTION,
    );
    let mut cases = vec![
        standard,
        Case::golden("empty", ""),
        Case::golden("inbound-ports-wildcard", "-b *"),
        Case::golden("inbound-ports-include", "-b 32000,31000"),
        Case::golden("ipnets", "-i 10.0.0.0/8"),
        Case::golden("kube-virt-interfaces", "-k eth1,eth2 -i *"),
        Case::golden(
            "ipnets-with-kube-virt-interfaces",
            "-k eth1,eth2 -i 10.0.0.0/8",
        ),
        Case::golden("outbound-ports-include", "-q 32000,31000"),
        Case::golden("basic-exclude-nic", "-c not-istio-nic"),
        Case::golden("drop-invalid", "--drop-invalid"),
        Case::golden_with_loopback("host-ipv4-loopback-cidr", "", "127.0.0.1/8")
            .env("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8"),
        Case::golden("ipv6-empty-inbound-ports", r#"-b """#),
        Case::golden("ipv6-inbound-ports", "-b 4000,5000"),
        Case::golden("ipv6-virt-interfaces", "-b 4000,5000 -k eth0,eth1"),
        // istio's own test passes `-d "6000,7000,"`, trailing comma included.
        Case::golden(
            "ipv6-ipnets",
            "-b 4000,5000 -d 6000,7000, -k eth0,eth1 -x 2001:db8::/32 -i 2001:db8::/32",
        ),
        uid_gid_clients(Case::golden(
            "ipv6-uid-gid",
            "-b 4000,5000 -d 6000,7000 -k eth0,eth1 -g 1,2 -u 3,4 -x 2001:db8::/32 \
             -i 2001:db8::/32",
        )),
        Case::golden("ipv6-outbound-ports", r#"-b "" -q 32000,31000"#),
    ];
    let owner_groups = owner_group_cases("", "");
    cases.extend(owner_groups.iter().cloned());
    cases.extend(owner_groups.into_iter().map(Case::with_capture_all));
    cases.extend(dns_cases());
    cases.extend([
        outbound_exclusions(),
        loopback_include(),
        uid_gid_capture_all(),
    ]);
    cases
}

/// The case called `name`; panics naming the known ones.
pub fn case(name: &str) -> Case {
    let all = cases();
    let names: Vec<String> = all.iter().map(|c| c.name.clone()).collect();
    all.into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no conformance case {name:?}; known: {names:?}"))
}

/// The case names of CASES.md's table.
pub fn cases_md_names() -> Vec<String> {
    let path = golden_dir().join("CASES.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter_map(|line| line.strip_prefix('|'))
        .filter_map(|row| row.split('|').next())
        .map(str::trim)
        .filter(|name| !name.is_empty() && *name != "case" && !name.starts_with('-'))
        .map(str::to_owned)
        .collect()
}
