//! Keys and values of the maps shared by every pod on a node.
//!
//! Per-pod entries are keyed by the pod's network-namespace cookie, so one loaded object
//! serves any number of pods without them sharing configuration or connection state.

use core::mem::offset_of;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Names of the maps in the eBPF object; user space opens them by these names.
pub mod names {
    pub const POD_CONFIG: &str = "POD_CONFIG";
    pub const PORT_SETS: &str = "PORT_SETS";
    pub const CIDRS_V4: &str = "CIDRS_V4";
    pub const CIDRS_V6: &str = "CIDRS_V6";
    pub const ORIG_DST_BY_COOKIE: &str = "ORIG_DST_BY_COOKIE";
    pub const ORIG_DST_BY_CONN: &str = "ORIG_DST_BY_CONN";
    pub const COUNTERS: &str = "COUNTERS";
    pub const POD_BY_ADDR: &str = "POD_BY_ADDR";
    pub const DNS_ORIG_BY_COOKIE: &str = "DNS_ORIG_BY_COOKIE";
    pub const LISTENERS: &str = "LISTENERS";
    pub const ADDR_MISSES: &str = "ADDR_MISSES";
    pub const POD_COOKIE: &str = "POD_COOKIE";
    /// ztunnel's connections being made to a pod's app (Istio ambient).
    pub const ZTUNNEL_UPSTREAMS: &str = "ZTUNNEL_UPSTREAMS";
    /// The decision trace's ring buffer (`trace::TraceRecord`s).
    pub const TRACE: &str = "TRACE";
    /// Maps pinned beside the others but in none of the lists below, since objects pinned
    /// by earlier releases lack them and an object's check must not refuse those: the
    /// trace ring (such objects logged through aya-log, which `redirector trace` tells) and
    /// ztunnel's connections being made (such objects serve no ambient pod). Neither holds
    /// state to share or copy on an upgrade.
    pub const NEWER: [&str; 2] = [TRACE, ZTUNNEL_UPSTREAMS];
    /// Every map, for pinning and status.
    pub const ALL: [&str; 12] = [
        POD_CONFIG,
        PORT_SETS,
        CIDRS_V4,
        CIDRS_V6,
        ORIG_DST_BY_COOKIE,
        ORIG_DST_BY_CONN,
        COUNTERS,
        POD_BY_ADDR,
        LISTENERS,
        DNS_ORIG_BY_COOKIE,
        ADDR_MISSES,
        POD_COOKIE,
    ];
    /// The maps the programs write as connections come and go. An upgrade has the new
    /// programs use the running object's maps whenever their entries keep their shape
    /// (type, key and value size), whatever the capacities: a connection that meets the old
    /// programs at connect and the new ones at accept then finds its entry.
    pub const IN_FLIGHT: [&str; 4] = [
        ORIG_DST_BY_COOKIE,
        ORIG_DST_BY_CONN,
        DNS_ORIG_BY_COOKIE,
        ADDR_MISSES,
    ];
}

/// Capacity of the maps, and what each costs before it holds anything.
///
/// Allocated per entry, so an additional pod costs only its own entries: the per-pod hash
/// maps (`POD_CONFIG`, `PORT_SETS`, `POD_BY_ADDR`, `COUNTERS`, created with
/// `BPF_F_NO_PREALLOC`; their bucket arrays are still sized by capacity at creation), the
/// LPM tries (`CIDRS_V4`, `CIDRS_V6`; the kernel requires `BPF_F_NO_PREALLOC` of them), and
/// the sockhash `LISTENERS` (the kernel allocates its elements on update, its buckets at
/// creation). Preallocated in full once per node: the LRU maps of connection and DNS state
/// (`ORIG_DST_BY_COOKIE`, `ORIG_DST_BY_CONN`, `DNS_ORIG_BY_COOKIE`) and of addresses
/// inbound lookups did not know (`ADDR_MISSES`), and ztunnel's connections being made
/// (`ZTUNNEL_UPSTREAMS`); the kernel has no LRU map without preallocation.
pub mod capacity {
    /// Pods per node.
    pub const PODS: u32 = 4096;
    /// Port-set entries over all pods (`-o`, `-q`, `-b`, `-d` ports): 8 a pod on average
    /// at the pod capacity (istio's standard injection lists 3). The bucket array, sized by
    /// this at creation, is 16 bytes an entry whether used or not.
    pub const PORT_ENTRIES: u32 = 32768;
    /// CIDR entries per family over all pods.
    pub const CIDR_ENTRIES: u32 = 65536;
    /// Connections between `connect()` and the handshake completing, node-wide: entries
    /// live for a handshake with the proxy on loopback (microseconds), so this bounds
    /// connects in flight; past it the least recently used entry goes first.
    pub const PENDING_CONNECTIONS: u32 = 4096;
    /// Redirected connections whose original destination the proxy may still ask for.
    /// Entries go when the proxy's socket closes; past this many open redirected
    /// connections the least recently used entry goes first, which only matters if the
    /// proxy has not yet asked for it (it asks at accept) or the app calls `getpeername`
    /// on an old connection.
    pub const REDIRECTED_CONNECTIONS: u32 = 32768;
    /// Pod addresses over all pods.
    pub const POD_ADDRS: u32 = 16384;
    /// UDP sockets whose DNS queries were redirected, for restoring reply sources
    /// (least recently used first out: a reply comes within a resolver's timeout).
    pub const DNS_SOCKETS: u32 = 8192;
    /// Capture listeners (-z and -p, per family) over all pods.
    pub const LISTENERS: u32 = 4 * PODS;
    /// Addresses of captured namespaces that inbound connections came to and no pod was
    /// set up with, noted for user space (least recently seen first out).
    pub const ADDR_MISSES: u32 = 256;
    /// Connections ztunnel is making to an app of the pod it runs for, node-wide, from its
    /// connect until the handshake completes (least recently made first out).
    pub const ZTUNNEL_UPSTREAMS: u32 = 1024;
}

/// Most proxy uids, gids or owner groups one pod may list.
pub const MAX_OWNERS: usize = 8;
/// Most interfaces one pod may list in `-c` or `-k`.
pub const MAX_IFACES: usize = 8;

// PodConfig counts its list entries in bytes.
const _: () = assert!(MAX_OWNERS <= u8::MAX as usize && MAX_IFACES <= u8::MAX as usize);

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// An IP address as the kernel hands it to BPF programs: network byte order, IPv4 in
/// the first word and the rest zero.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RawIp(pub [u32; 4]);

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = assert!(size_of::<RawIp>() == 16 && align_of::<RawIp>() == 4);

impl RawIp {
    pub const fn from_v4_be(addr: u32) -> Self {
        RawIp([addr, 0, 0, 0])
    }

    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => RawIp::from_v4_be(u32::from_ne_bytes(v4.octets())),
            IpAddr::V6(v6) => {
                let o = v6.octets();
                let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
                RawIp([w(0), w(4), w(8), w(12)])
            }
        }
    }

    pub fn v4(self) -> Ipv4Addr {
        Ipv4Addr::from(self.0[0].to_ne_bytes())
    }

    pub fn v6(self) -> Ipv6Addr {
        let [a, b, c, d] = self.0.map(u32::to_ne_bytes);
        Ipv6Addr::from([
            a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1],
            d[2], d[3],
        ])
    }

    pub fn ip(self, family: u16) -> IpAddr {
        if family == AF_INET6 {
            IpAddr::V6(self.v6())
        } else {
            IpAddr::V4(self.v4())
        }
    }
}

/// Per-pod configuration: the istio-iptables flags reduced to what the programs need.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodConfig {
    /// `-p`: where captured outbound connections go.
    pub outbound_port: u16,
    /// `-z`: where captured inbound connections go.
    pub inbound_port: u16,
    /// `-e`: never captured.
    pub tunnel_port: u16,
    /// [`inbound_capture`] mode (`-b`).
    pub inbound_capture: u16,
    /// [`pod_flags`] bits.
    pub flags: u32,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`, network byte order address and mask.
    pub loopback_v4_addr: u32,
    pub loopback_v4_mask: u32,
    /// [`owner_group_mode`] of `owner_groups`.
    pub owner_group_mode: u32,
    // How many entries of each list are used. Bytes, so that the whole config is 192
    // bytes: with the kernel's element header and key, a POD_CONFIG entry then takes a
    // 256-byte allocation where 204 bytes took a 512-byte one.
    pub proxy_uid_count: u8,
    pub proxy_gid_count: u8,
    pub owner_group_count: u8,
    pub exclude_iface_count: u8,
    pub virt_iface_count: u8,
    pub reserved: [u8; 3],
    pub proxy_uids: [u32; MAX_OWNERS],
    pub proxy_gids: [u32; MAX_OWNERS],
    pub owner_groups: [u32; MAX_OWNERS],
    /// `-c`: ifindexes whose inbound traffic is never captured.
    pub exclude_ifaces: [u32; MAX_IFACES],
    /// `-k`: ifindexes whose inbound traffic is treated as outbound.
    pub virt_ifaces: [u32; MAX_IFACES],
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = {
    assert!(size_of::<PodConfig>() == 192 && align_of::<PodConfig>() == 4);
    assert!(offset_of!(PodConfig, flags) == 8);
    assert!(offset_of!(PodConfig, loopback_v4_addr) == 12);
    assert!(offset_of!(PodConfig, owner_group_mode) == 20);
    assert!(offset_of!(PodConfig, proxy_uid_count) == 24);
    assert!(offset_of!(PodConfig, reserved) == 29);
    assert!(offset_of!(PodConfig, proxy_uids) == 32);
    assert!(offset_of!(PodConfig, virt_ifaces) == 160);
};

pub mod pod_flags {
    /// `-i '*'`: every destination not otherwise excluded is captured.
    pub const CAPTURE_ALL_OUTBOUND: u32 = 1 << 0;
    /// IPv6 connections are handled (istio writes ip6tables rules only when IPv6 is on).
    pub const IPV6: u32 = 1 << 1;
    /// `--redirect-dns`.
    pub const DNS_CAPTURE: u32 = 1 << 2;
    /// Let a connection through uncaptured when its state cannot be recorded.
    pub const FAIL_OPEN: u32 = 1 << 3;
    /// `--capture-all-dns`: port 53 to any address, not only the resolv.conf servers.
    pub const CAPTURE_ALL_DNS: u32 = 1 << 4;
    /// An `-i` CIDR holds a loopback address: istio then leaves out its rules that let lo
    /// traffic of non-proxy owners through.
    pub const INCLUDE_HAS_LOOPBACK: u32 = 1 << 5;
    /// `redirector trace` is watching this pod: each decision goes to the trace ring.
    pub const TRACE: u32 = 1 << 6;
    // Lists the pod left empty, so that connect4/6 look nothing up in them. Set for an
    // empty list rather than a full one: a config written before these bits existed
    // then still looks up everything.
    /// `-o` is empty.
    pub const NO_OUTBOUND_EXCLUDE_PORTS: u32 = 1 << 7;
    /// `-q` is empty.
    pub const NO_OUTBOUND_INCLUDE_PORTS: u32 = 1 << 8;
    /// `-x` is empty.
    pub const NO_EXCLUDE_CIDRS: u32 = 1 << 9;
    /// `-i` lists no CIDR (it is empty or `*`).
    pub const NO_INCLUDE_CIDRS: u32 = 1 << 10;
    // Set where a list is used, unlike the bits above: istio's pods never have them.
    /// Every connection to a local address (loopback, the pod's own) passes, whoever makes
    /// it; none is sent to the inbound port (Linkerd's `-o lo -j RETURN`).
    pub const LOCAL_DESTINATIONS_PASS: u32 = 1 << 11;
    /// `SO_ORIGINAL_DST` answers a connection that was not redirected with its own
    /// destination, as conntrack does.
    pub const ORIG_DST_OF_UNREDIRECTED: u32 = 1 << 12;
    /// Outbound ports never captured are held as prefixes ([`CidrList::OutboundExcludePorts`]).
    pub const OUTBOUND_EXCLUDE_PORT_RANGES: u32 = 1 << 13;
    /// Inbound ports never captured are held as prefixes ([`CidrList::InboundExcludePorts`]).
    pub const INBOUND_EXCLUDE_PORT_RANGES: u32 = 1 << 14;
    /// Inbound connections from [`CidrList::InboundExcludeSource`] are never captured.
    pub const INBOUND_EXCLUDE_SOURCES: u32 = 1 << 15;
    /// An ambient pod: ztunnel, from its own cgroup, proxies it from inside its network
    /// namespace. Inbound connections ztunnel makes to the pod's apps (recorded in
    /// `ZTUNNEL_UPSTREAMS` as it connects) are let through, never captured.
    pub const ZTUNNEL: u32 = 1 << 16;
}

pub mod inbound_capture {
    /// `-b ''`: no inbound capture.
    pub const NONE: u16 = 0;
    /// `-b '*'`: every port but `-d` ports and the tunnel port.
    pub const ALL: u16 = 1;
    /// `-b LIST`: the listed ports only.
    pub const LIST: u16 = 2;
}

pub mod owner_group_mode {
    /// `ISTIO_OUTBOUND_OWNER_GROUPS='*'` and no exclusions: every group is captured.
    pub const ALL: u32 = 0;
    /// Only the listed groups are captured.
    pub const INCLUDE: u32 = 1;
    /// The listed groups are never captured.
    pub const EXCLUDE: u32 = 2;
}

/// A discriminant read back from a map key that names no variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownDiscriminant(pub u32);

/// Which port list of a pod a [`PortKey`] belongs to.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSet {
    /// `-o`: outbound ports never captured.
    OutboundExclude = 1,
    /// `-q`: outbound ports always captured.
    OutboundInclude = 2,
    /// `-b`: inbound ports captured (when not `*`).
    InboundInclude = 3,
    /// `-d`: inbound ports never captured (with `-b '*'`).
    InboundExclude = 4,
}

impl PortSet {
    pub const ALL: [PortSet; 4] = [
        PortSet::OutboundExclude,
        PortSet::OutboundInclude,
        PortSet::InboundInclude,
        PortSet::InboundExclude,
    ];

    /// The list's name, with the istio-iptables flag that fills it.
    pub const fn name(self) -> &'static str {
        match self {
            PortSet::OutboundExclude => "outbound-exclude (-o)",
            PortSet::OutboundInclude => "outbound-include (-q)",
            PortSet::InboundInclude => "inbound-include (-b)",
            PortSet::InboundExclude => "inbound-exclude (-d)",
        }
    }
}

impl TryFrom<u16> for PortSet {
    type Error = UnknownDiscriminant;

    fn try_from(value: u16) -> Result<Self, Self::Error> {
        PortSet::ALL
            .into_iter()
            .find(|set| *set as u16 == value)
            .ok_or(UnknownDiscriminant(u32::from(value)))
    }
}

#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortKey {
    pub netns_cookie: u64,
    pub port: u16,
    pub set: u16,
    pub _pad: u32,
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = {
    assert!(size_of::<PortKey>() == 16 && align_of::<PortKey>() == 8);
    assert!(offset_of!(PortKey, port) == 8 && offset_of!(PortKey, set) == 10);
    assert!(offset_of!(PortKey, _pad) == 12);
};

impl PortKey {
    pub const fn new(netns_cookie: u64, set: PortSet, port: u16) -> Self {
        PortKey {
            netns_cookie,
            port,
            set: set as u16,
            _pad: 0,
        }
    }
}

/// Which address list of a pod a CIDR key belongs to.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CidrList {
    /// `-i`
    Include = 1,
    /// `-x`
    Exclude = 2,
    /// The pod's own addresses: a connection to one of them leaves through `lo`.
    Local = 3,
    /// The pod's DNS servers (resolv.conf), for `--redirect-dns`.
    DnsServer = 4,
    /// The pod's routes, when `-c` names interfaces: the value says whether the route
    /// leaves through one of them.
    Route = 5,
    /// Outbound port ranges never captured, as prefixes of [`port_as_address`] (IPv4 trie).
    OutboundExcludePorts = 6,
    /// Inbound port ranges never captured, likewise.
    InboundExcludePorts = 7,
    /// Sources whose inbound connections are never captured.
    InboundExcludeSource = 8,
}

/// A port where a [`CidrList`] of ports holds it: the first 16 bits of an IPv4 address,
/// so that a range is a few prefixes (0-65535 is one) looked up in one LPM lookup.
#[inline(always)]
pub const fn port_as_address(port: u16) -> Ipv4Addr {
    let [high, low] = port.to_be_bytes();
    Ipv4Addr::new(high, low, 0, 0)
}

impl CidrList {
    pub const ALL: [CidrList; 8] = [
        CidrList::Include,
        CidrList::Exclude,
        CidrList::Local,
        CidrList::DnsServer,
        CidrList::Route,
        CidrList::OutboundExcludePorts,
        CidrList::InboundExcludePorts,
        CidrList::InboundExcludeSource,
    ];

    /// The list's name, with the istio-iptables flag that fills it.
    pub const fn name(self) -> &'static str {
        match self {
            CidrList::Include => "include (-i)",
            CidrList::Exclude => "exclude (-x)",
            CidrList::Local => "pod-local",
            CidrList::DnsServer => "dns-server",
            CidrList::Route => "route",
            CidrList::OutboundExcludePorts => "outbound-exclude-port-ranges",
            CidrList::InboundExcludePorts => "inbound-exclude-port-ranges",
            CidrList::InboundExcludeSource => "inbound-exclude-sources",
        }
    }
}

impl TryFrom<u32> for CidrList {
    type Error = UnknownDiscriminant;

    fn try_from(value: u32) -> Result<Self, Self::Error> {
        CidrList::ALL
            .into_iter()
            .find(|list| *list as u32 == value)
            .ok_or(UnknownDiscriminant(value))
    }
}

/// Bits of a CIDR key that precede the address (the cookie and the list): always matched.
pub const CIDR_KEY_FIXED_BITS: u32 = 96;

/// Data of an IPv4 LPM-trie key; the prefix length is `CIDR_KEY_FIXED_BITS + cidr prefix`.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr4Key {
    pub netns_cookie: u64,
    pub list: u32,
    /// Network byte order.
    pub addr: [u8; 4],
}

// Shared with the eBPF programs; the address follows the key's fixed bits.
const _: () = {
    assert!(size_of::<Cidr4Key>() == 16 && align_of::<Cidr4Key>() == 8);
    assert!(offset_of!(Cidr4Key, list) == 8);
    assert!(offset_of!(Cidr4Key, addr) == CIDR_KEY_FIXED_BITS as usize / 8);
};

impl Cidr4Key {
    pub const fn new(netns_cookie: u64, list: CidrList, addr: [u8; 4]) -> Self {
        Cidr4Key {
            netns_cookie,
            list: list as u32,
            addr,
        }
    }
}

/// Data of an IPv6 LPM-trie key.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr6Key {
    pub netns_cookie: u64,
    pub list: u32,
    pub addr: [u8; 16],
    /// Never part of a prefix.
    pub _pad: u32,
}

// Shared with the eBPF programs; the address follows the key's fixed bits.
const _: () = {
    assert!(size_of::<Cidr6Key>() == 32 && align_of::<Cidr6Key>() == 8);
    assert!(offset_of!(Cidr6Key, list) == 8);
    assert!(offset_of!(Cidr6Key, addr) == CIDR_KEY_FIXED_BITS as usize / 8);
    assert!(offset_of!(Cidr6Key, _pad) == 28);
};

/// A pod address, for finding the pod of an inbound connection (sk_lookup programs have no
/// netns cookie helper; pod addresses are unique on a node).
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodAddrKey {
    pub addr: RawIp,
    pub family: u32,
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = {
    assert!(size_of::<PodAddrKey>() == 20 && align_of::<PodAddrKey>() == 4);
    assert!(offset_of!(PodAddrKey, family) == 16);
};

/// A pod's capture listener in [`names::LISTENERS`]: the proxy's socket on `-z` or `-p`.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerKey {
    pub netns_cookie: u64,
    pub port: u16,
    pub family: u16,
    pub _pad: u32,
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = {
    assert!(size_of::<ListenerKey>() == 16 && align_of::<ListenerKey>() == 8);
    assert!(offset_of!(ListenerKey, port) == 8 && offset_of!(ListenerKey, family) == 10);
    assert!(offset_of!(ListenerKey, _pad) == 12);
};

impl Cidr6Key {
    pub const fn new(netns_cookie: u64, list: CidrList, addr: [u8; 16]) -> Self {
        Cidr6Key {
            netns_cookie,
            list: list as u32,
            addr,
            _pad: 0,
        }
    }
}

/// Where a redirected connection was going, as `SO_ORIGINAL_DST` reports it.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrigDst {
    pub addr: RawIp,
    /// Host byte order.
    pub port: u16,
    pub family: u16,
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = {
    assert!(size_of::<OrigDst>() == 20 && align_of::<OrigDst>() == 4);
    assert!(offset_of!(OrigDst, port) == 16 && offset_of!(OrigDst, family) == 18);
};

/// One end of a TCP connection: its address as the kernel stores it, and its port in host
/// byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: RawIp,
    pub port: u16,
}

/// The end of a redirected connection that called `connect()`: the app (inbound: the
/// remote peer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientEnd(pub Endpoint);

/// The end that accepted it: the proxy's listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyEnd(pub Endpoint);

/// A redirected connection as both ends see it: the app's local address is the proxy's
/// peer, the proxy's listener address is the app's peer. Built with [`ConnKey::new`], so
/// which end is which is a matter of types, not of argument order.
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnKey {
    pub netns_cookie: u64,
    pub client: RawIp,
    pub proxy: RawIp,
    /// Host byte order.
    pub client_port: u16,
    pub proxy_port: u16,
    pub family: u32,
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = {
    assert!(size_of::<ConnKey>() == 48 && align_of::<ConnKey>() == 8);
    assert!(offset_of!(ConnKey, client) == 8 && offset_of!(ConnKey, proxy) == 24);
    assert!(offset_of!(ConnKey, client_port) == 40 && offset_of!(ConnKey, proxy_port) == 42);
    assert!(offset_of!(ConnKey, family) == 44);
};

impl ConnKey {
    pub const fn new(netns_cookie: u64, family: u16, client: ClientEnd, proxy: ProxyEnd) -> Self {
        ConnKey {
            netns_cookie,
            client: client.0.addr,
            proxy: proxy.0.addr,
            client_port: client.0.port,
            proxy_port: proxy.0.port,
            family: family as u32,
        }
    }
}

/// Number of counter slots per pod: the reasons, with room for a few added later. Each
/// pod has a set per CPU, so a slot costs 8 bytes × CPUs per pod.
pub const COUNTER_SLOTS: usize = 24;

const _: () = assert!(crate::Reason::ALL.len() <= COUNTER_SLOTS);

/// Per-pod, per-CPU decision counters, indexed by [`crate::Reason`].
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub by_reason: [u64; COUNTER_SLOTS],
}

// Shared with the eBPF programs (bpfel): any target laying it out otherwise fails to build.
const _: () = assert!(size_of::<Counters>() == 8 * COUNTER_SLOTS && align_of::<Counters>() == 8);

impl Default for Counters {
    fn default() -> Self {
        Counters {
            by_reason: [0; COUNTER_SLOTS],
        }
    }
}

/// `aya::Pod` for every map key and value, from `bytemuck::Pod`: the derive above makes
/// the compiler reject hidden padding and fields that are not plain data, which is exactly
/// what `aya::Pod` asks for.
#[cfg(feature = "user")]
macro_rules! aya_pod_from_bytemuck {
    ($($t:ty),* $(,)?) => {
        $(
            const _: () = {
                const fn proven<T: bytemuck::Pod>() {}
                proven::<$t>();
            };
            // SAFETY: `$t` is `bytemuck::Pod` (checked above): `#[repr(C)]`/transparent,
            // `Copy`, no padding, every bit pattern valid.
            unsafe impl aya::Pod for $t {}
        )*
    };
}

#[cfg(feature = "user")]
aya_pod_from_bytemuck!(
    RawIp,
    PodConfig,
    PortKey,
    Cidr4Key,
    Cidr6Key,
    OrigDst,
    ConnKey,
    Counters,
    PodAddrKey,
    ListenerKey,
    crate::NetnsCookie,
    crate::TraceRecord,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discriminants_round_trip_and_unknown_ones_are_errors() {
        for set in PortSet::ALL {
            assert_eq!(PortSet::try_from(set as u16), Ok(set));
        }
        for list in CidrList::ALL {
            assert_eq!(CidrList::try_from(list as u32), Ok(list));
        }
        assert_eq!(PortSet::try_from(0), Err(UnknownDiscriminant(0)));
        assert_eq!(CidrList::try_from(9), Err(UnknownDiscriminant(9)));
    }

    #[test]
    fn names_are_the_ones_user_space_prints() {
        let sets = PortSet::ALL.map(PortSet::name);
        assert_eq!(
            sets,
            [
                "outbound-exclude (-o)",
                "outbound-include (-q)",
                "inbound-include (-b)",
                "inbound-exclude (-d)",
            ]
        );
        let lists = CidrList::ALL.map(CidrList::name);
        assert_eq!(
            lists,
            [
                "include (-i)",
                "exclude (-x)",
                "pod-local",
                "dns-server",
                "route",
                "outbound-exclude-port-ranges",
                "inbound-exclude-port-ranges",
                "inbound-exclude-sources",
            ]
        );
    }

    #[test]
    fn a_port_is_held_in_the_first_16_bits_of_an_address() {
        assert_eq!(port_as_address(0), Ipv4Addr::new(0, 0, 0, 0));
        assert_eq!(port_as_address(4143), Ipv4Addr::new(0x10, 0x2f, 0, 0));
        assert_eq!(port_as_address(65535), Ipv4Addr::new(255, 255, 0, 0));
    }

    #[test]
    fn conn_key_puts_each_end_in_its_place() {
        let client = Endpoint {
            addr: RawIp::from_v4_be(1),
            port: 40000,
        };
        let proxy = Endpoint {
            addr: RawIp::from_v4_be(2),
            port: 15001,
        };
        let key = ConnKey::new(7, AF_INET, ClientEnd(client), ProxyEnd(proxy));
        assert_eq!((key.client, key.client_port), (client.addr, client.port));
        assert_eq!((key.proxy, key.proxy_port), (proxy.addr, proxy.port));
        assert_eq!(key.family, u32::from(AF_INET));
    }

    #[test]
    fn raw_ip_round_trips() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(RawIp::from_ip(v4).ip(AF_INET), v4);
        let v6: IpAddr = "fd00::1:2".parse().unwrap();
        assert_eq!(RawIp::from_ip(v6).ip(AF_INET6), v6);
    }
}
