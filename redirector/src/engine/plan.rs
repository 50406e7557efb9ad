//! From a pod's capture configuration to the exact kernel state it needs: pure data,
//! printed by `--dry-run`, executed by `apply`, and queried by `explain`.

use std::{
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
};

use ipnet::{IpNet, Ipv4Net};
use redirector_common::{
    decision::ROUTE_VIA_EXCLUDED_INTERFACE, inbound_capture, owner_group_mode, pod_flags,
    port_as_address, Cidr4Key, Cidr6Key, CidrList, NetnsCookie, PodAddrKey, PodConfig, PodLookups,
    PortKey, PortSet, RawIp, AF_INET, AF_INET6, CIDR_KEY_FIXED_BITS,
};

use crate::{
    engine::facts::PodFacts,
    engine::spec::{CaptureConfig, CidrSelection, OwnerGroups, PortSelection},
    store::programs::{AttachTarget, ProgramSpec, BASE_PROGRAMS, NETNS_PROGRAMS, POD_PROGRAMS},
    sys::user_ns::{IdMap, PodIds},
};

/// One LPM-trie entry: a prefix length (including the fixed cookie/list bits) and data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrEntry<K> {
    pub prefix_len: u32,
    pub data: K,
    /// 1 for a list member; for routes, whether the route leaves through a `-c` interface.
    pub value: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPlan {
    pub netns_cookie: NetnsCookie,
    /// The cgroup the pod's cgroup programs attach to; `None` when the node's links (daemon
    /// mode) already cover it, and the pod gets only its network-namespace link.
    pub cgroup: Option<PathBuf>,
    pub config: PodConfig,
    pub ports: Vec<PortKey>,
    pub cidrs_v4: Vec<CidrEntry<Cidr4Key>>,
    pub cidrs_v6: Vec<CidrEntry<Cidr6Key>>,
    /// The pod's addresses, so inbound connections find the pod.
    pub addrs: Vec<PodAddrKey>,
    pub programs: &'static [ProgramSpec],
}

/// The ifindexes of the named interfaces that exist in the pod.
fn ifindexes(names: &[String], interfaces: &[(String, u32)]) -> Vec<u32> {
    names
        .iter()
        .filter_map(|name| {
            interfaces
                .iter()
                .find(|(n, _)| n == name)
                .map(|&(_, index)| index)
        })
        .collect()
}

/// The first `N` ids as a fixed array and a count (config validation keeps lists within N).
fn owner_array<const N: usize>(ids: &[u32]) -> ([u32; N], u8) {
    let mut out = [0; N];
    let n = ids.len().min(N);
    out[..n].copy_from_slice(&ids[..n]);
    // N is MAX_OWNERS or MAX_IFACES, which a byte holds (asserted beside them).
    (out, n as u8)
}

fn cidr_entry(netns_cookie: NetnsCookie, list: CidrList, net: IpNet, plan: &mut PodPlan) {
    cidr_entry_with(netns_cookie, list, net, 1, plan);
}

fn cidr_entry_with(
    netns_cookie: NetnsCookie,
    list: CidrList,
    net: IpNet,
    value: u8,
    plan: &mut PodPlan,
) {
    let prefix_len = CIDR_KEY_FIXED_BITS + u32::from(net.prefix_len());
    match net.trunc() {
        IpNet::V4(v4) => plan.cidrs_v4.push(CidrEntry {
            prefix_len,
            data: Cidr4Key::new(netns_cookie.get(), list, v4.addr().octets()),
            value,
        }),
        IpNet::V6(v6) => plan.cidrs_v6.push(CidrEntry {
            prefix_len,
            data: Cidr6Key::new(netns_cookie.get(), list, v6.addr().octets()),
            value,
        }),
    }
}

/// Whether DNS is captured: `--redirect-dns`, unless the pod has no resolv.conf server and
/// `--capture-all-dns` is off. istio-iptables then switches DNS capture off altogether
/// ("REDIRECT_DNS is set, but CAPTURE_ALL_DNS is false, and no DNS servers provided",
/// capture/run.go), which also keeps port 53 in its proxy-owner rules.
pub fn dns_capture_enabled(cfg: &CaptureConfig, facts: &PodFacts) -> bool {
    cfg.redirect_dns && (cfg.capture_all_dns || !facts.dns_servers.is_empty())
}

/// Plan the kernel state for one pod.
pub fn plan_pod(cfg: &CaptureConfig, facts: &PodFacts) -> PodPlan {
    let cookie = facts.netns_cookie;
    let redirect_dns = dns_capture_enabled(cfg, facts);
    // The programs see ids of the initial user namespace: a user-namespaced pod's are
    // translated through its maps.
    let host = |ids: &[u32], map: fn(&PodIds) -> &IdMap| -> Vec<u32> {
        match &facts.ids {
            Some(pod) => ids.iter().map(|id| map(pod).to_outside(*id)).collect(),
            None => ids.to_vec(),
        }
    };
    let (proxy_uids, proxy_uid_count) = owner_array(&host(&cfg.proxy_uids, |p| &p.uids));
    let (proxy_gids, proxy_gid_count) = owner_array(&host(&cfg.proxy_gids, |p| &p.gids));
    let (owner_group_mode, groups) = match &cfg.owner_groups {
        OwnerGroups::All => (owner_group_mode::ALL, &[][..]),
        OwnerGroups::Include(g) => (owner_group_mode::INCLUDE, &g[..]),
        OwnerGroups::Exclude(g) => (owner_group_mode::EXCLUDE, &g[..]),
    };
    let (owner_groups, owner_group_count) = owner_array(&host(groups, |p| &p.gids));
    let (exclude_ifaces, exclude_iface_count) =
        owner_array(&ifindexes(&cfg.exclude_interfaces, &facts.interfaces));
    let (virt_ifaces, virt_iface_count) =
        owner_array(&ifindexes(&cfg.kube_virt_interfaces, &facts.interfaces));
    let mut flags = 0;
    if matches!(cfg.outbound_cidrs, CidrSelection::All) {
        flags |= pod_flags::CAPTURE_ALL_OUTBOUND;
    }
    if (facts.has_ipv6() || cfg.dual_stack) && !cfg.ipv6_off {
        flags |= pod_flags::IPV6;
    }
    for (wanted, flag) in [
        (
            cfg.local_destinations_pass,
            pod_flags::LOCAL_DESTINATIONS_PASS,
        ),
        (
            cfg.orig_dst_of_unredirected,
            pod_flags::ORIG_DST_OF_UNREDIRECTED,
        ),
        (
            !cfg.outbound_exclude_port_ranges.is_empty(),
            pod_flags::OUTBOUND_EXCLUDE_PORT_RANGES,
        ),
        (
            !cfg.inbound_exclude_port_ranges.is_empty(),
            pod_flags::INBOUND_EXCLUDE_PORT_RANGES,
        ),
        (
            !cfg.inbound_exclude_sources.is_empty(),
            pod_flags::INBOUND_EXCLUDE_SOURCES,
        ),
        (cfg.ztunnel, pod_flags::ZTUNNEL),
    ] {
        if wanted {
            flags |= flag;
        }
    }
    if redirect_dns {
        flags |= pod_flags::DNS_CAPTURE;
    }
    if cfg.fail_open {
        flags |= pod_flags::FAIL_OPEN;
    }
    if cfg.capture_all_dns {
        flags |= pod_flags::CAPTURE_ALL_DNS;
    }
    if let CidrSelection::List(nets) = &cfg.outbound_cidrs {
        if nets.iter().any(|net| net.addr().is_loopback()) {
            flags |= pod_flags::INCLUDE_HAS_LOOPBACK;
        }
    }
    let loopback = cfg.loopback_v4_cidr.trunc();
    let config = PodConfig {
        outbound_port: cfg.outbound_port,
        inbound_port: cfg.inbound_port,
        tunnel_port: cfg.tunnel_port,
        inbound_capture: match &cfg.inbound_ports {
            PortSelection::None => inbound_capture::NONE,
            PortSelection::All => inbound_capture::ALL,
            PortSelection::List(_) => inbound_capture::LIST,
        },
        flags,
        loopback_v4_addr: u32::from_ne_bytes(loopback.network().octets()),
        loopback_v4_mask: u32::from_ne_bytes(loopback.netmask().octets()),
        proxy_uid_count,
        proxy_uids,
        proxy_gid_count,
        proxy_gids,
        owner_group_mode,
        owner_group_count,
        owner_groups,
        exclude_iface_count,
        exclude_ifaces,
        virt_iface_count,
        virt_ifaces,
        reserved: [0; 3],
    };
    let mut plan = PodPlan {
        netns_cookie: cookie,
        cgroup: facts.cgroup.clone(),
        config,
        ports: Vec::new(),
        cidrs_v4: Vec::new(),
        cidrs_v6: Vec::new(),
        addrs: Vec::new(),
        programs: match (&facts.cgroup, redirect_dns) {
            (None, _) => &NETNS_PROGRAMS,
            (Some(_), true) => &POD_PROGRAMS,
            (Some(_), false) => &POD_PROGRAMS[..BASE_PROGRAMS],
        },
    };
    let inbound_include: &[u16] = match &cfg.inbound_ports {
        PortSelection::List(ports) => ports,
        PortSelection::None | PortSelection::All => &[],
    };
    for (set, ports) in [
        (PortSet::OutboundExclude, &cfg.outbound_exclude_ports[..]),
        (PortSet::OutboundInclude, &cfg.outbound_include_ports[..]),
        (PortSet::InboundInclude, inbound_include),
        (PortSet::InboundExclude, &cfg.inbound_exclude_ports[..]),
    ] {
        for &port in ports {
            let key = PortKey::new(cookie.get(), set, port);
            if !plan.ports.contains(&key) {
                plan.ports.push(key);
            }
        }
    }
    if let CidrSelection::List(nets) = &cfg.outbound_cidrs {
        for &net in nets {
            cidr_entry(cookie, CidrList::Include, net, &mut plan);
        }
    }
    for &net in &cfg.exclude_cidrs {
        cidr_entry(cookie, CidrList::Exclude, net, &mut plan);
    }
    for (list, ranges) in [
        (
            CidrList::OutboundExcludePorts,
            &cfg.outbound_exclude_port_ranges,
        ),
        (
            CidrList::InboundExcludePorts,
            &cfg.inbound_exclude_port_ranges,
        ),
    ] {
        for (first, bits) in ranges.iter().flat_map(|range| range.prefixes()) {
            let net = Ipv4Net::new_assert(port_as_address(first), bits);
            cidr_entry(cookie, list, IpNet::V4(net), &mut plan);
        }
    }
    for &net in &cfg.inbound_exclude_sources {
        cidr_entry(cookie, CidrList::InboundExcludeSource, net, &mut plan);
    }
    // -c: the pod's routes, each marked with whether it leaves through an excluded interface.
    if exclude_iface_count > 0 {
        let excluded = &exclude_ifaces[..exclude_iface_count as usize];
        for &(net, oif) in &facts.routes {
            let value = u8::from(excluded.contains(&oif)) * ROUTE_VIA_EXCLUDED_INTERFACE;
            cidr_entry_with(cookie, CidrList::Route, net, value, &mut plan);
        }
    }
    if redirect_dns {
        for &server in &facts.dns_servers {
            cidr_entry(cookie, CidrList::DnsServer, IpNet::from(server), &mut plan);
        }
    }
    for &addr in &facts.local_addrs {
        cidr_entry(cookie, CidrList::Local, IpNet::from(addr), &mut plan);
        let family = if addr.is_ipv6() { AF_INET6 } else { AF_INET };
        plan.addrs.push(PodAddrKey {
            addr: RawIp::from_ip(addr),
            family: u32::from(family),
        });
    }
    plan.config.flags |= empty_list_flags(&plan);
    plan
}

/// [`pod_flags`] of the outbound lists the plan leaves empty, from its entries themselves.
fn empty_list_flags(plan: &PodPlan) -> u32 {
    let no_port = |set: PortSet| !plan.ports.iter().any(|k| k.set == set as u16);
    let no_cidr = |list: CidrList| {
        let list = list as u32;
        !plan.cidrs_v4.iter().any(|e| e.data.list == list)
            && !plan.cidrs_v6.iter().any(|e| e.data.list == list)
    };
    [
        (
            no_port(PortSet::OutboundExclude),
            pod_flags::NO_OUTBOUND_EXCLUDE_PORTS,
        ),
        (
            no_port(PortSet::OutboundInclude),
            pod_flags::NO_OUTBOUND_INCLUDE_PORTS,
        ),
        (no_cidr(CidrList::Exclude), pod_flags::NO_EXCLUDE_CIDRS),
        (no_cidr(CidrList::Include), pod_flags::NO_INCLUDE_CIDRS),
    ]
    .into_iter()
    .filter(|(empty, _)| *empty)
    .fold(0, |flags, (_, flag)| flags | flag)
}

fn prefix_match(entry_bits: &[u8], addr_bits: &[u8], prefix: u32) -> bool {
    let full = (prefix / 8) as usize;
    let rest = prefix % 8;
    entry_bits[..full] == addr_bits[..full]
        && (rest == 0 || (entry_bits[full] ^ addr_bits[full]) & (0xff << (8 - rest)) == 0)
}

/// The plan answers set membership the way the kernel's maps would.
impl PodLookups for PodPlan {
    fn port_in(&self, set: PortSet, port: u16) -> bool {
        self.ports
            .contains(&PortKey::new(self.netns_cookie.get(), set, port))
    }

    fn cidr_value(&self, list: CidrList, addr: IpAddr) -> Option<u8> {
        let longest = |entries: &mut dyn Iterator<Item = (u32, u8)>| {
            entries.max_by_key(|&(len, _)| len).map(|(_, v)| v)
        };
        match addr {
            IpAddr::V4(v4) => longest(
                &mut self
                    .cidrs_v4
                    .iter()
                    .filter(|e| {
                        e.data.list == list as u32
                            && prefix_match(
                                &e.data.addr,
                                &v4.octets(),
                                e.prefix_len - CIDR_KEY_FIXED_BITS,
                            )
                    })
                    .map(|e| (e.prefix_len, e.value)),
            ),
            IpAddr::V6(v6) => longest(
                &mut self
                    .cidrs_v6
                    .iter()
                    .filter(|e| {
                        e.data.list == list as u32
                            && prefix_match(
                                &e.data.addr,
                                &v6.octets(),
                                e.prefix_len - CIDR_KEY_FIXED_BITS,
                            )
                    })
                    .map(|e| (e.prefix_len, e.value)),
            ),
        }
    }
}

fn set_name(set: u16) -> &'static str {
    PortSet::try_from(set).map_or("unknown", PortSet::name)
}

fn list_name(list: u32) -> &'static str {
    CidrList::try_from(list).map_or("unknown", CidrList::name)
}

/// The ports an entry of a port-range list covers, `first-last`; `None` for an address.
fn port_prefix(list: u32, addr: std::net::Ipv4Addr, bits: u32) -> Option<String> {
    let ports = [
        CidrList::OutboundExcludePorts,
        CidrList::InboundExcludePorts,
    ];
    if !ports.iter().any(|l| *l as u32 == list) || bits > 16 {
        return None;
    }
    let [high, low, ..] = addr.octets();
    let first = u32::from(u16::from_be_bytes([high, low]));
    let last = first + (1 << (16 - bits)) - 1;
    Some(crate::engine::spec::PortRange::new(first as u16, last as u16)?.to_string())
}

/// The readable form printed by `--dry-run` and logged on apply.
impl fmt::Display for PodPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(f, "pod netns cookie {}", self.netns_cookie)?;
        for p in self.programs {
            match p.target {
                AttachTarget::Cgroup => writeln!(
                    f,
                    "attach {} ({}) to cgroup {}",
                    p.function,
                    p.hook,
                    self.cgroup.as_deref().unwrap_or(Path::new("?")).display()
                )?,
                AttachTarget::Netns => writeln!(
                    f,
                    "attach {} ({}) to the pod's network namespace",
                    p.function, p.hook
                )?,
            }
        }
        if self.cgroup.is_none() {
            writeln!(
                f,
                "cgroup programs: the node's (attached once by the daemon)"
            )?;
        }
        writeln!(
            f,
            "POD_CONFIG[{}] = outbound_port={} inbound_port={} tunnel_port={} inbound_capture={} flags={:#x} loopback_v4={}/{} proxy_uids={:?} proxy_gids={:?} owner_groups(mode {})={:?} exclude_ifindexes={:?} virt_ifindexes={:?}",
            self.netns_cookie,
            c.outbound_port,
            c.inbound_port,
            c.tunnel_port,
            match c.inbound_capture {
                inbound_capture::ALL => "all",
                inbound_capture::LIST => "list",
                _ => "none",
            },
            c.flags,
            std::net::Ipv4Addr::from(c.loopback_v4_addr.to_ne_bytes()),
            c.loopback_v4_mask.count_ones(),
            &c.proxy_uids[..c.proxy_uid_count as usize],
            &c.proxy_gids[..c.proxy_gid_count as usize],
            c.owner_group_mode,
            &c.owner_groups[..c.owner_group_count as usize],
            &c.exclude_ifaces[..c.exclude_iface_count as usize],
            &c.virt_ifaces[..c.virt_iface_count as usize],
        )?;
        for k in &self.ports {
            writeln!(
                f,
                "PORT_SETS[{} {} {}]",
                k.netns_cookie,
                set_name(k.set),
                k.port
            )?;
        }
        for e in &self.cidrs_v4 {
            let ip = std::net::Ipv4Addr::from(e.data.addr);
            let bits = e.prefix_len - CIDR_KEY_FIXED_BITS;
            if let Some(ports) = port_prefix(e.data.list, ip, bits) {
                writeln!(
                    f,
                    "CIDRS_V4[{} {} ports {ports}] = {}",
                    e.data.netns_cookie,
                    list_name(e.data.list),
                    e.value
                )?;
                continue;
            }
            writeln!(
                f,
                "CIDRS_V4[{} {} {ip}/{}] = {}",
                e.data.netns_cookie,
                list_name(e.data.list),
                e.prefix_len - CIDR_KEY_FIXED_BITS,
                e.value
            )?;
        }
        for e in &self.cidrs_v6 {
            let ip = std::net::Ipv6Addr::from(e.data.addr);
            writeln!(
                f,
                "CIDRS_V6[{} {} {ip}/{}] = {}",
                e.data.netns_cookie,
                list_name(e.data.list),
                e.prefix_len - CIDR_KEY_FIXED_BITS,
                e.value
            )?;
        }
        for a in &self.addrs {
            writeln!(
                f,
                "POD_BY_ADDR[{}] = {}",
                a.addr.ip(a.family as u16),
                self.netns_cookie
            )?;
        }
        writeln!(f, "COUNTERS[{}] = 0 (created if absent)", self.netns_cookie)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::IpAddr;

    use redirector_common::{decide_outbound, OutboundAttempt, Reason, Verdict};

    use super::*;
    use crate::mesh::istio::parse_istio_iptables;

    const POD_IP: &str = "10.244.1.5";

    fn plan(args: &[&str], env: &[(&str, &str)]) -> PodPlan {
        plan_with_dns_servers(args, env, &["10.96.0.10"])
    }

    fn plan_with_dns_servers(args: &[&str], env: &[(&str, &str)], dns_servers: &[&str]) -> PodPlan {
        plan_with(args, env, dns_servers, None)
    }

    fn plan_with(
        args: &[&str],
        env: &[(&str, &str)],
        dns_servers: &[&str],
        ids: Option<PodIds>,
    ) -> PodPlan {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv = std::iter::once("istio-iptables").chain(args.iter().copied());
        let cfg = parse_istio_iptables(argv, &env).expect("valid flags");
        let facts = PodFacts {
            netns_cookie: NetnsCookie(42),
            local_addrs: vec![POD_IP.parse().unwrap(), "fd00::5".parse().unwrap()],
            cgroup: Some("/sys/fs/cgroup/pod".into()),
            interfaces: vec![("lo".into(), 1), ("eth0".into(), 2), ("eth1".into(), 3)],
            dns_servers: dns_servers.iter().map(|s| s.parse().unwrap()).collect(),
            routes: vec![
                ("0.0.0.0/0".parse().unwrap(), 2),
                ("10.244.1.0/24".parse().unwrap(), 2),
                ("172.16.0.0/12".parse().unwrap(), 3),
            ],
            ids,
        };
        plan_pod(&cfg.capture, &facts)
    }

    /// A pod with `lo` and `eth0`, the pod's addresses on them, and no routes or DNS
    /// servers of note.
    fn two_interface_facts(netns_cookie: NetnsCookie) -> PodFacts {
        PodFacts {
            netns_cookie,
            local_addrs: vec![POD_IP.parse().unwrap(), "fd00::5".parse().unwrap()],
            cgroup: Some("/sys/fs/cgroup/pod".into()),
            interfaces: vec![("lo".into(), 1), ("eth0".into(), 2)],
            dns_servers: vec![],
            routes: vec![],
            ids: None,
        }
    }

    fn decide(plan: &PodPlan, uid: u32, dst: &str, port: u16) -> Verdict {
        decide_from(plan, uid, uid, "0.0.0.0", dst, port)
    }

    fn decide_from(plan: &PodPlan, uid: u32, gid: u32, src: &str, dst: &str, port: u16) -> Verdict {
        let attempt = OutboundAttempt {
            protocol: redirector_common::Protocol::Tcp,
            dst: dst.parse::<IpAddr>().unwrap(),
            dst_port: port,
            src: src.parse().unwrap(),
            uid,
            gid,
        };
        decide_outbound(&plan.config, &attempt, plan)
    }

    use crate::mesh::istio::annotations::STANDARD_INJECTION as STANDARD;

    #[test]
    fn standard_injection_decisions_follow_istio_rule_order() {
        let p = plan(&STANDARD, &[]);
        assert_eq!(decide(&p, 1000, "10.0.0.1", 80), Verdict::Capture);
        assert_eq!(decide(&p, 1000, "2001:db8::1", 443), Verdict::Capture);
        assert_eq!(
            decide(&p, 1337, "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(
            decide_from(&p, 1000, 1337, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        // The proxy calling its own pod goes back through the inbound port, except 15008.
        assert_eq!(decide(&p, 1337, POD_IP, 8080), Verdict::CaptureInbound);
        assert_eq!(decide(&p, 1337, "fd00::5", 8080), Verdict::CaptureInbound);
        assert_eq!(
            decide(&p, 1337, POD_IP, 15008),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(
            decide(&p, 1337, "127.0.0.1", 8080),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(decide(&p, 1337, "127.0.0.2", 8080), Verdict::CaptureInbound);
        // The app calling a local address passes.
        assert_eq!(
            decide(&p, 1000, POD_IP, 8080),
            Verdict::Pass(Reason::PassedLocalNotProxy)
        );
        assert_eq!(
            decide(&p, 1000, "127.0.0.1", 8080),
            Verdict::Pass(Reason::PassedLocalNotProxy)
        );
        assert_eq!(
            decide(&p, 1000, "::1", 8080),
            Verdict::Pass(Reason::PassedLocalNotProxy)
        );
        // Inbound passthrough source.
        assert_eq!(
            decide_from(&p, 1337, 1337, "127.0.0.6", POD_IP, 8080),
            Verdict::Pass(Reason::PassedInboundPassthrough)
        );
    }

    #[test]
    fn cidr_and_port_lists() {
        let p = plan(
            &[
                "-i",
                "10.0.0.0/8,2001:db8::/32",
                "-x",
                "10.96.0.0/12",
                "-q",
                "3306",
                "-o",
                "9000",
            ],
            &[],
        );
        assert_eq!(decide(&p, 1000, "10.1.2.3", 80), Verdict::Capture);
        assert_eq!(
            decide(&p, 1000, "10.96.0.10", 80),
            Verdict::Pass(Reason::PassedExcludedCidr)
        );
        // -x is checked before -q, -o before everything.
        assert_eq!(
            decide(&p, 1000, "10.96.0.10", 3306),
            Verdict::Pass(Reason::PassedExcludedCidr)
        );
        assert_eq!(decide(&p, 1000, "192.168.1.1", 3306), Verdict::Capture);
        assert_eq!(
            decide(&p, 1000, "10.1.2.3", 9000),
            Verdict::Pass(Reason::PassedExcludedPort)
        );
        assert_eq!(
            decide(&p, 1000, "192.168.1.1", 80),
            Verdict::Pass(Reason::PassedNotIncluded)
        );
        assert_eq!(decide(&p, 1000, "2001:db8::1", 80), Verdict::Capture);
        assert_eq!(
            decide(&p, 1000, "2001:db9::1", 80),
            Verdict::Pass(Reason::PassedNotIncluded)
        );
    }

    #[test]
    fn empty_include_list_captures_nothing() {
        let p = plan(&[], &[]);
        assert_eq!(
            decide(&p, 1000, "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedNotIncluded)
        );
    }

    #[test]
    fn several_proxy_uids_keep_istios_rule_order() {
        // istio writes the three owner rules per uid in turn, so local traffic of the second
        // uid already returns at the first uid's "! --uid-owner" rule.
        let p = plan(&["-i", "*", "-u", "3,4", "-g", "5"], &[]);
        assert_eq!(decide(&p, 3, POD_IP, 80), Verdict::CaptureInbound);
        assert_eq!(
            decide(&p, 4, POD_IP, 80),
            Verdict::Pass(Reason::PassedLocalNotProxy)
        );
        assert_eq!(
            decide(&p, 4, "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(
            decide_from(&p, 1000, 5, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
    }

    #[test]
    fn a_user_namespaced_pods_ids_are_translated_to_the_hosts() {
        let ids = PodIds {
            uids: IdMap::parse("0 100000 65536").unwrap(),
            gids: IdMap::parse("0 200000 65536").unwrap(),
        };
        let p = plan_with(
            &["-i", "*", "-u", "1337", "-g", "1337,70000"],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS", "202")],
            &[],
            Some(ids),
        );
        let c = &p.config;
        assert_eq!(c.proxy_uids[..c.proxy_uid_count as usize], [101337]);
        // An id the map does not cover matches no process of the pod.
        assert_eq!(
            c.proxy_gids[..c.proxy_gid_count as usize],
            [201337, crate::sys::user_ns::UNMAPPED]
        );
        assert_eq!(c.owner_groups[..c.owner_group_count as usize], [200202]);
        assert_eq!(
            decide_from(&p, 101337, 201337, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(
            decide_from(&p, 1337, 1337, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedOwnerGroup)
        );
    }

    #[test]
    fn owner_groups_and_loopback_cidr_from_env() {
        let p = plan(&["-i", "*"], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "202")]);
        assert_eq!(
            decide_from(&p, 1000, 202, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Capture
        );
        assert_eq!(
            decide_from(&p, 1000, 1000, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedOwnerGroup)
        );
        let p = plan(
            &["-i", "*"],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "202")],
        );
        assert_eq!(
            decide_from(&p, 1000, 202, "0.0.0.0", "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedOwnerGroup)
        );
        let p = plan(
            &["-i", "*"],
            &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8")],
        );
        assert_eq!(
            p.config.loopback_v4_addr,
            u32::from_ne_bytes([127, 0, 0, 0])
        );
        assert_eq!(
            p.config.loopback_v4_mask,
            u32::from_ne_bytes([255, 0, 0, 0])
        );
    }

    #[test]
    fn empty_lists_are_flagged_and_a_config_without_the_flags_decides_the_same() {
        let empty = pod_flags::NO_OUTBOUND_EXCLUDE_PORTS
            | pod_flags::NO_OUTBOUND_INCLUDE_PORTS
            | pod_flags::NO_EXCLUDE_CIDRS
            | pod_flags::NO_INCLUDE_CIDRS;
        let standard = plan(&["-p", "15001", "-u", "1337", "-i", "*", "-x", ""], &[]);
        assert_eq!(standard.config.flags & empty, empty);
        let listed = plan(
            &[
                "-i",
                "10.0.0.0/8",
                "-x",
                "10.1.0.0/16",
                "-o",
                "22",
                "-q",
                "8080",
            ],
            &[],
        );
        assert_eq!(listed.config.flags & empty, 0);
        // Written by a release before the flags: every list is looked up, to the same end.
        for p in [standard, listed] {
            let mut unflagged = p.clone();
            unflagged.config.flags &= !empty;
            for (uid, dst, port) in [
                (1000, "10.0.0.1", 80),
                (1000, "10.1.0.1", 80),
                (1000, "10.2.0.1", 22),
                (1000, "192.168.0.1", 8080),
                (1000, POD_IP, 80),
                (1337, POD_IP, 80),
                (1337, "10.0.0.1", 80),
            ] {
                assert_eq!(
                    decide(&p, uid, dst, port),
                    decide(&unflagged, uid, dst, port),
                    "uid {uid} to {dst}:{port}"
                );
            }
        }
    }

    #[test]
    fn plan_holds_one_entry_per_list_item() {
        let p = plan(&STANDARD, &[]);
        assert_eq!(
            p.config.flags & pod_flags::CAPTURE_ALL_OUTBOUND,
            pod_flags::CAPTURE_ALL_OUTBOUND
        );
        assert_eq!(
            p.config.flags & pod_flags::IPV6,
            pod_flags::IPV6,
            "the pod has an IPv6 address"
        );
        let excluded: Vec<u16> = p
            .ports
            .iter()
            .filter(|k| k.set == PortSet::InboundExclude as u16)
            .map(|k| k.port)
            .collect();
        assert_eq!(excluded, [15090, 15021, 15020]);
        // The pod's own addresses, as /32 and /128.
        assert_eq!(p.cidrs_v4.len(), 1);
        assert_eq!(p.cidrs_v4[0].prefix_len, CIDR_KEY_FIXED_BITS + 32);
        assert_eq!(p.cidrs_v6.len(), 1);
        assert!(p.to_string().contains("inbound-exclude (-d) 15090"));
        let twice = plan(&["-o", "80,80,", "-i", "*"], &[]);
        assert_eq!(twice.ports.len(), 1);
    }

    fn inbound(plan: &PodPlan, port: u16, ifindex: u32) -> Verdict {
        let attempt = redirector_common::InboundAttempt {
            dst: POD_IP.parse().unwrap(),
            src: "10.0.0.9".parse().unwrap(),
            dst_port: port,
            ifindex,
        };
        redirector_common::decide_inbound(&plan.config, &attempt, plan)
    }

    #[test]
    fn inbound_decisions() {
        let p = plan(&STANDARD, &[]);
        assert_eq!(inbound(&p, 8080, 2), Verdict::CaptureInbound);
        assert_eq!(
            inbound(&p, 15021, 2),
            Verdict::Pass(Reason::PassedInboundPort)
        );
        assert_eq!(
            inbound(&p, 15008, 2),
            Verdict::Pass(Reason::PassedInboundPort)
        );
        let p = plan(&["-b", "8080,9090"], &[]);
        assert_eq!(inbound(&p, 9090, 2), Verdict::CaptureInbound);
        assert_eq!(
            inbound(&p, 7070, 2),
            Verdict::Pass(Reason::PassedInboundPort)
        );
        assert_eq!(
            inbound(&plan(&[], &[]), 8080, 2),
            Verdict::Pass(Reason::PassedInboundPort)
        );
        // -c eth0 and -k eth1 (ifindexes 2 and 3 in this pod).
        let p = plan(
            &[
                "-b",
                "*",
                "-i",
                "10.0.0.0/8",
                "-c",
                "eth0",
                "-k",
                "eth1,missing0",
            ],
            &[],
        );
        assert_eq!(inbound(&p, 8080, 2), Verdict::Pass(Reason::PassedInterface));
        assert_eq!(inbound(&p, 8080, 3), Verdict::Capture);
        assert_eq!(
            p.config.virt_iface_count, 1,
            "an interface missing from the pod is left out"
        );
        let p = plan(&["-b", "*", "-i", "192.168.0.0/16", "-k", "eth1"], &[]);
        assert_eq!(inbound(&p, 8080, 3), Verdict::Pass(Reason::PassedInterface));
    }

    fn decide_udp(plan: &PodPlan, uid: u32, dst: &str, port: u16) -> Verdict {
        let attempt = OutboundAttempt {
            protocol: redirector_common::Protocol::Udp,
            dst: dst.parse::<IpAddr>().unwrap(),
            dst_port: port,
            src: "0.0.0.0".parse().unwrap(),
            uid,
            gid: uid,
        };
        decide_outbound(&plan.config, &attempt, plan)
    }

    #[test]
    fn dns_capture_decisions() {
        let p = plan(&["-i", "*", "--redirect-dns"], &[]);
        assert_eq!(decide_udp(&p, 1000, "10.96.0.10", 53), Verdict::CaptureDns);
        assert_eq!(decide(&p, 1000, "10.96.0.10", 53), Verdict::CaptureDns);
        assert_eq!(
            decide_udp(&p, 1000, "8.8.8.8", 53),
            Verdict::Pass(Reason::PassedNotTcp)
        );
        assert_eq!(decide(&p, 1000, "8.8.8.8", 53), Verdict::Capture);
        assert_eq!(
            decide_udp(&p, 1337, "10.96.0.10", 53),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(
            decide_udp(&p, 1000, "10.96.0.10", 5353),
            Verdict::Pass(Reason::PassedNotTcp)
        );
        assert_eq!(
            p.programs.len(),
            POD_PROGRAMS.len(),
            "the UDP programs are attached"
        );
        let all = plan(&["-i", "*", "--redirect-dns", "--capture-all-dns"], &[]);
        assert_eq!(decide_udp(&all, 1000, "8.8.8.8", 53), Verdict::CaptureDns);
        // Without --redirect-dns nothing of UDP is captured and no UDP program attached.
        let off = plan(&["-i", "*"], &[]);
        assert_eq!(
            decide_udp(&off, 1000, "10.96.0.10", 53),
            Verdict::Pass(Reason::PassedNotTcp)
        );
        assert_eq!(off.programs.len(), BASE_PROGRAMS);
        // istio keeps port 53 out of the uids' own-pod rule but not out of the gids'.
        let p = plan(&["-i", "*", "--redirect-dns", "-u", "3", "-g", "1"], &[]);
        assert_eq!(
            decide_from(&p, 3, 9, "0.0.0.0", POD_IP, 53),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        assert_eq!(
            decide_from(&p, 5, 1, "0.0.0.0", POD_IP, 53),
            Verdict::CaptureInbound
        );
        assert_eq!(
            decide_from(&p, 5, 9, "0.0.0.0", POD_IP, 53),
            Verdict::Capture
        );
    }

    #[test]
    fn redirect_dns_without_servers_is_off_as_in_istio() {
        // No resolv.conf server and no --capture-all-dns: no DNS capture, no UDP programs,
        // and the proxy's own TCP to its pod on port 53 goes to the inbound port as usual.
        let p = plan_with_dns_servers(
            &["-i", "*", "--redirect-dns", "-u", "3", "-g", "1"],
            &[],
            &[],
        );
        assert_eq!(p.config.flags & pod_flags::DNS_CAPTURE, 0);
        assert_eq!(p.programs.len(), BASE_PROGRAMS);
        assert_eq!(
            decide_from(&p, 3, 9, "0.0.0.0", POD_IP, 53),
            Verdict::CaptureInbound
        );
        assert_eq!(
            decide_from(&p, 5, 1, "0.0.0.0", "127.0.0.53", 53),
            Verdict::Pass(Reason::PassedLocalNotProxy)
        );
        // --capture-all-dns needs no server.
        let all = plan_with_dns_servers(
            &["-i", "*", "--redirect-dns", "--capture-all-dns"],
            &[],
            &[],
        );
        assert_eq!(decide_udp(&all, 1000, "8.8.8.8", 53), Verdict::CaptureDns);
        assert_eq!(all.programs.len(), POD_PROGRAMS.len());
    }

    /// An ambient pod's plan (ztunnel's ports, every destination), its DNS capture `dns`.
    fn ambient(dns: bool) -> PodPlan {
        let flags: Vec<String> = ["--pod-uid", "u", "--name", "ns/app", "--dns-capture"]
            .into_iter()
            .map(str::to_owned)
            .chain(std::iter::once(dns.to_string()))
            .collect();
        let cfg = crate::mesh::ambient::AmbientArgs::of(&flags)
            .expect("an ambient pod's flags")
            .capture();
        plan_pod(&cfg, &two_interface_facts(NetnsCookie(9)))
    }

    #[test]
    fn an_ambient_pods_dns_is_captured_before_its_local_destinations_pass() {
        let p = ambient(true);
        let (dns, local) = (Verdict::CaptureDns, Verdict::Pass(Reason::PassedLoopback));
        // Any server off the pod, both protocols, both families.
        for server in ["10.96.0.10", "8.8.8.8", "2001:db8::53"] {
            assert_eq!(decide_udp(&p, 1000, server, 53), dns, "{server}");
            assert_eq!(decide(&p, 1000, server, 53), dns, "{server}");
        }
        // UDP leaving through lo (loopback, the pod's own addresses) is left alone
        // (`! -o lo`); TCP only to 127.0.0.1 and ::1 (`! -d 127.0.0.1/32`).
        for server in ["127.0.0.53", "127.0.0.1", POD_IP, "::1", "fd00::5"] {
            assert_eq!(decide_udp(&p, 1000, server, 53), local, "{server}");
        }
        for server in ["127.0.0.53", POD_IP, "fd00::5"] {
            assert_eq!(decide(&p, 1000, server, 53), dns, "{server}");
        }
        for server in ["127.0.0.1", "::1"] {
            assert_eq!(decide(&p, 1000, server, 53), local, "{server}");
        }
        // Other local TCP passes as before; other UDP is never captured.
        assert_eq!(decide(&p, 1000, POD_IP, 8080), local);
        assert_eq!(
            decide_udp(&p, 1000, "10.96.0.10", 5353),
            Verdict::Pass(Reason::PassedNotTcp)
        );
        // DNS capture off: UDP 53 passes, TCP 53 is outbound TCP (ztunnel's 15001).
        let off = ambient(false);
        assert_eq!(
            decide_udp(&off, 1000, "10.96.0.10", 53),
            Verdict::Pass(Reason::PassedNotTcp)
        );
        assert_eq!(decide(&off, 1000, "10.96.0.10", 53), Verdict::Capture);
        assert_eq!(decide(&off, 1000, "127.0.0.53", 53), local);
    }

    #[test]
    fn excluded_interface_routes_pass_outbound() {
        // Routes: default and 10.244.1.0/24 via eth0 (2), 172.16.0.0/12 via eth1 (3).
        let p = plan(&["-i", "*", "-c", "eth1"], &[]);
        assert_eq!(
            decide(&p, 1000, "172.20.0.1", 80),
            Verdict::Pass(Reason::PassedInterface)
        );
        assert_eq!(decide(&p, 1000, "10.0.0.1", 80), Verdict::Capture);
        let p = plan(&["-i", "*", "-c", "eth0"], &[]);
        assert_eq!(
            decide(&p, 1000, "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedInterface)
        );
        assert_eq!(
            decide(&p, 1000, "172.20.0.1", 80),
            Verdict::Capture,
            "the longer route wins"
        );
        assert!(plan(&["-i", "*"], &[])
            .cidrs_v4
            .iter()
            .all(|e| e.data.list != CidrList::Route as u32));
    }

    /// The spec as a Linkerd pod has it: ranges, sources, local destinations passing.
    fn linkerd_like(ipv6_off: bool) -> PodPlan {
        use crate::engine::spec::PortRange;
        let argv = [
            "istio-iptables",
            "-p",
            "4140",
            "-z",
            "4143",
            "-u",
            "2102",
            "-i",
            "*",
            "-b",
            "*",
        ];
        let mut cfg = parse_istio_iptables(argv, &HashMap::<String, String>::new())
            .unwrap()
            .capture;
        cfg.outbound_exclude_port_ranges = vec![PortRange::new(1000, 2000).unwrap()];
        cfg.inbound_exclude_port_ranges =
            vec![PortRange::new(4190, 4191).unwrap(), PortRange::single(22)];
        cfg.inbound_exclude_sources = vec!["192.168.0.0/16".parse().unwrap()];
        cfg.local_destinations_pass = true;
        cfg.orig_dst_of_unredirected = true;
        cfg.ipv6_off = ipv6_off;
        plan_pod(&cfg, &two_interface_facts(NetnsCookie(7)))
    }

    fn inbound_from(plan: &PodPlan, src: &str, port: u16) -> Verdict {
        let attempt = redirector_common::InboundAttempt {
            dst: POD_IP.parse().unwrap(),
            src: src.parse().unwrap(),
            dst_port: port,
            ifindex: 2,
        };
        redirector_common::decide_inbound(&plan.config, &attempt, plan)
    }

    #[test]
    fn port_ranges_sources_and_local_destinations_decide_as_planned() {
        let p = linkerd_like(false);
        for flag in [
            pod_flags::LOCAL_DESTINATIONS_PASS,
            pod_flags::ORIG_DST_OF_UNREDIRECTED,
            pod_flags::OUTBOUND_EXCLUDE_PORT_RANGES,
            pod_flags::INBOUND_EXCLUDE_PORT_RANGES,
            pod_flags::INBOUND_EXCLUDE_SOURCES,
            pod_flags::IPV6,
        ] {
            assert_eq!(p.config.flags & flag, flag, "{flag:#x}");
        }
        // Outbound: 1000-2000 passes at both ends, not beside them.
        let passed = Verdict::Pass(Reason::PassedExcludedPort);
        assert_eq!(decide(&p, 1000, "10.0.0.1", 1000), passed);
        assert_eq!(decide(&p, 1000, "10.0.0.1", 2000), passed);
        assert_eq!(decide(&p, 1000, "10.0.0.1", 999), Verdict::Capture);
        assert_eq!(decide(&p, 1000, "10.0.0.1", 2001), Verdict::Capture);
        // Local destinations pass for everyone; the proxy calling its pod stays direct.
        let local = Verdict::Pass(Reason::PassedLoopback);
        assert_eq!(decide(&p, 1000, POD_IP, 8080), local);
        assert_eq!(decide(&p, 2102, POD_IP, 8080), local);
        assert_eq!(decide(&p, 1000, "127.0.0.5", 8080), local);
        assert_eq!(decide(&p, 1000, "::1", 8080), local);
        assert_eq!(decide(&p, 1000, "fd00::5", 8080), local);
        assert_eq!(
            decide(&p, 2102, "10.0.0.1", 80),
            Verdict::Pass(Reason::PassedProxyOwner)
        );
        // Inbound: ranges and single ports, then sources.
        let port = Verdict::Pass(Reason::PassedInboundPort);
        assert_eq!(inbound_from(&p, "10.0.0.9", 4190), port);
        assert_eq!(inbound_from(&p, "10.0.0.9", 4191), port);
        assert_eq!(inbound_from(&p, "10.0.0.9", 22), port);
        assert_eq!(inbound_from(&p, "10.0.0.9", 4192), Verdict::CaptureInbound);
        assert_eq!(inbound_from(&p, "10.0.0.9", 23), Verdict::CaptureInbound);
        assert_eq!(
            inbound_from(&p, "192.168.3.4", 8080),
            Verdict::Pass(Reason::PassedExcludedCidr)
        );
        let shown = p.to_string();
        assert!(
            shown.contains("outbound-exclude-port-ranges ports 1000-1007"),
            "{shown}"
        );
        assert!(
            shown.contains("inbound-exclude-port-ranges ports 4190-4191"),
            "{shown}"
        );
        assert!(
            shown.contains("inbound-exclude-sources 192.168.0.0/16"),
            "{shown}"
        );
        // IPv6 off: not captured whatever the pod's addresses.
        assert_eq!(linkerd_like(true).config.flags & pod_flags::IPV6, 0);
    }
}
