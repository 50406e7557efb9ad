//! A pod's capture spec: what to capture and where it goes. istio-iptables' flags are
//! one way to write it (`istio`); the engine knows only this.

use std::fmt;

use ipnet::{IpNet, Ipv4Net};

/// The effective capture settings of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// `-p`: where captured outbound connections go.
    pub outbound_port: u16,
    /// `-z`: where captured inbound connections go.
    pub inbound_port: u16,
    /// `-e`: the HBONE tunnel port, never captured.
    pub tunnel_port: u16,
    /// `-u`: owners whose traffic is never captured (the proxy).
    pub proxy_uids: Vec<u32>,
    /// `-g`: as `proxy_uids`, by group.
    pub proxy_gids: Vec<u32>,
    /// `-m`
    pub inbound_mode: InterceptionMode,
    /// `-b`
    pub inbound_ports: PortSelection,
    /// `-d`: only meaningful with `-b '*'`.
    pub inbound_exclude_ports: Vec<u16>,
    /// `-c`: interfaces whose traffic is never captured.
    pub exclude_interfaces: Vec<String>,
    /// `-i`
    pub outbound_cidrs: CidrSelection,
    /// `-x`
    pub exclude_cidrs: Vec<IpNet>,
    /// `-q`: outbound ports always captured.
    pub outbound_include_ports: Vec<u16>,
    /// `-o`: outbound ports never captured.
    pub outbound_exclude_ports: Vec<u16>,
    /// `-k`: inbound traffic from these interfaces is treated as outbound.
    pub kube_virt_interfaces: Vec<String>,
    /// `-t`
    pub tproxy_mark: u32,
    /// `-r`
    pub tproxy_route_table: u32,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS` / `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`
    pub owner_groups: OwnerGroups,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: destinations never captured.
    pub loopback_v4_cidr: Ipv4Net,
    /// `--redirect-dns` / `ISTIO_META_DNS_CAPTURE`
    pub redirect_dns: bool,
    /// `--capture-all-dns`: every port-53 destination, not only the resolv.conf servers.
    pub capture_all_dns: bool,
    /// `--drop-invalid` / `INVALID_DROP`
    pub drop_invalid: bool,
    /// `--dual-stack` / `ISTIO_DUAL_STACK`
    pub dual_stack: bool,
    /// `--fail-open`: let a connection through uncaptured if its state cannot be recorded.
    pub fail_open: bool,
    /// Port ranges never captured outbound, beside `outbound_exclude_ports` (held as
    /// prefixes, so 0-65535 costs one entry).
    pub outbound_exclude_port_ranges: Vec<PortRange>,
    /// Port ranges never captured inbound, whatever `inbound_ports` says.
    pub inbound_exclude_port_ranges: Vec<PortRange>,
    /// Inbound connections from these sources are never captured.
    pub inbound_exclude_sources: Vec<IpNet>,
    /// Every connection to a local address (loopback, the pod's own) passes, whoever makes
    /// it; the proxy calling its own pod is not sent to the inbound port.
    pub local_destinations_pass: bool,
    /// `SO_ORIGINAL_DST` on a connection that was not redirected answers its own
    /// destination, as conntrack does, rather than failing.
    pub orig_dst_of_unredirected: bool,
    /// IPv6 is left uncaptured in both directions, whatever the pod's addresses.
    pub ipv6_off: bool,
    /// Istio ambient: the proxy is ztunnel, from its own cgroup; its connections to the
    /// pod's apps are never captured.
    pub ztunnel: bool,
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// `first..=last`, or `None` when `first > last`.
    pub fn new(first: u16, last: u16) -> Option<Self> {
        (first <= last).then_some(PortRange { first, last })
    }

    pub fn single(port: u16) -> Self {
        PortRange {
            first: port,
            last: port,
        }
    }

    pub fn contains(self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    /// The fewest aligned prefixes that cover the range exactly, as (first port, prefix
    /// length in bits of a 16-bit port): at most 30, one for 0-65535.
    pub fn prefixes(self) -> Vec<(u16, u8)> {
        let mut out = Vec::new();
        let (mut start, end) = (u32::from(self.first), u32::from(self.last) + 1);
        while start < end {
            // The largest block aligned at `start` that fits before `end`.
            let mut size = if start == 0 {
                1 << 16
            } else {
                start & start.wrapping_neg()
            };
            while start + size > end {
                size >>= 1;
            }
            out.push((start as u16, 16 - size.trailing_zeros() as u8));
            start += size;
        }
        out
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PortRange;

    #[test]
    fn a_range_is_covered_by_its_prefixes_exactly() {
        for (first, last) in [
            (0, 65535),
            (0, 0),
            (65535, 65535),
            (4190, 4191),
            (1, 65534),
            (23, 25),
            (1000, 2000),
        ] {
            let range = PortRange::new(first, last).unwrap();
            let prefixes = range.prefixes();
            assert!(prefixes.len() <= 30, "{range}: {prefixes:?}");
            let covered = |port: u32| {
                prefixes
                    .iter()
                    .filter(|&&(start, len)| {
                        let size = 1u32 << (16 - len);
                        (u32::from(start)..u32::from(start) + size).contains(&port)
                    })
                    .count()
            };
            for port in 0..=65535u32 {
                let want = usize::from(range.contains(port as u16));
                assert_eq!(covered(port), want, "{range}: port {port} in {prefixes:?}");
            }
        }
        assert_eq!(PortRange::new(0, 65535).unwrap().prefixes(), vec![(0, 0)]);
        assert_eq!(PortRange::new(25, 23), None);
    }
}

/// What a node's pod is set up with: its capture settings and where its facts are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    pub capture: CaptureConfig,
    /// Where the pod's DNS servers are read.
    pub resolv_conf: std::path::PathBuf,
    /// Accept the host's network namespace as the pod's.
    pub allow_host_netns: bool,
}

/// How inbound connections reach the proxy (`-m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptionMode {
    Redirect,
    Tproxy,
}

impl fmt::Display for InterceptionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InterceptionMode::Redirect => "REDIRECT",
            InterceptionMode::Tproxy => "TPROXY",
        })
    }
}

/// Inbound ports to capture (`-b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSelection {
    /// `-b ''`: no inbound capture at all.
    None,
    /// `-b '*'`: every port except `-d` and the tunnel port.
    All,
    List(Vec<u16>),
}

/// Outbound destinations to capture (`-i`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CidrSelection {
    /// `-i ''`: nothing is captured by destination (`-q` ports still are).
    None,
    /// `-i '*'`: every destination not excluded.
    All,
    List(Vec<IpNet>),
}

/// Whose outbound traffic is captured, by the socket owner's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerGroups {
    /// Every group (`ISTIO_OUTBOUND_OWNER_GROUPS='*'`, no exclusions).
    All,
    /// Only these gids.
    Include(Vec<u32>),
    /// Every gid but these.
    Exclude(Vec<u32>),
}
