//! The object's maps. Their names are the ones in `redirector_common::names`.

use core::net::IpAddr;

#[expect(
    deprecated,
    reason = "BPF_MAP_TYPE_CGRP_STORAGE, its successor, needs 6.2"
)]
use aya_ebpf::maps::CgroupStorage;
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::generated::bpf_get_netns_cookie,
    macros::map,
    maps::{lpm_trie::Key, HashMap, LpmTrie, LruHashMap, PerCpuHashMap, SockHash},
    EbpfContext,
};
use redirector_common::{
    capacity, Cidr4Key, Cidr6Key, CidrList, ConnKey, Counters, ListenerKey, NetnsCookie, OrigDst,
    PodAddrKey, PodConfig, PodLookups, PortKey, PortSet, CIDR_KEY_FIXED_BITS,
};

/// netns cookie → the pod's configuration. A miss means "not a managed pod".
#[map]
pub static POD_CONFIG: HashMap<NetnsCookie, PodConfig> =
    HashMap::with_max_entries(capacity::PODS, BPF_F_NO_PREALLOC);

/// (netns cookie, list, port) present ⇔ the port is in that list.
#[map]
pub static PORT_SETS: HashMap<PortKey, u8> =
    HashMap::with_max_entries(capacity::PORT_ENTRIES, BPF_F_NO_PREALLOC);

#[map]
pub static CIDRS_V4: LpmTrie<Cidr4Key, u8> = LpmTrie::with_max_entries(capacity::CIDR_ENTRIES, 0);

#[map]
pub static CIDRS_V6: LpmTrie<Cidr6Key, u8> = LpmTrie::with_max_entries(capacity::CIDR_ENTRIES, 0);

/// socket cookie → original destination, from `connect()` until the handshake completes.
#[map]
pub static ORIG_DST_BY_COOKIE: LruHashMap<u64, OrigDst> =
    LruHashMap::with_max_entries(capacity::PENDING_CONNECTIONS, 0);

/// Established redirected connection → original destination, until the app's socket (an
/// inbound connection's: the proxy's) closes.
#[map]
pub static ORIG_DST_BY_CONN: LruHashMap<ConnKey, OrigDst> =
    LruHashMap::with_max_entries(capacity::REDIRECTED_CONNECTIONS, 0);

/// netns cookie → per-CPU decision counters. Entries are created by user space with the pod.
#[map]
pub static COUNTERS: PerCpuHashMap<NetnsCookie, Counters> =
    PerCpuHashMap::with_max_entries(capacity::PODS, BPF_F_NO_PREALLOC);

/// Pod address → netns cookie, for inbound connections (sk_lookup has no netns helper).
#[map]
pub static POD_BY_ADDR: HashMap<PodAddrKey, NetnsCookie> =
    HashMap::with_max_entries(capacity::POD_ADDRS, BPF_F_NO_PREALLOC);

/// Address of a captured namespace that an inbound connection came to and no pod was set
/// up with (one the pod gained later) → the interface it came in on. User space reads it
/// to add the address to its pod.
#[map]
pub static ADDR_MISSES: LruHashMap<PodAddrKey, u32> =
    LruHashMap::with_max_entries(capacity::ADDR_MISSES, 0);

/// The proxy's capture listeners, registered when they call listen().
#[map]
pub static LISTENERS: SockHash<ListenerKey> = SockHash::with_max_entries(capacity::LISTENERS, 0);

/// UDP socket cookie → where its DNS query was going, for the replies' source address.
#[map]
pub static DNS_ORIG_BY_COOKIE: LruHashMap<u64, OrigDst> =
    LruHashMap::with_max_entries(capacity::DNS_SOCKETS, 0);

/// ztunnel's connections to an app of the pod it proxies, seen from ztunnel's socket, from
/// its connect until the handshake completes: sk_lookup lets them through.
#[map]
pub static ZTUNNEL_UPSTREAMS: LruHashMap<ConnKey, u8> =
    LruHashMap::with_max_entries(capacity::ZTUNNEL_UPSTREAMS, 0);

/// The pod's netns cookie, stamped by user space on each pod cgroup the `*_cgroup_cookie`
/// programs are attached at: where sock_ops and getsockopt programs cannot call
/// bpf_get_netns_cookie (before 5.15). The kernel makes an entry per cgroup and attach
/// type at attach, so programs of the other variants never cost one.
#[map]
#[expect(
    deprecated,
    reason = "BPF_MAP_TYPE_CGRP_STORAGE, its successor, needs 6.2"
)]
pub static POD_COOKIE: CgroupStorage<NetnsCookie> = CgroupStorage::new();

/// The network namespace of the program's socket: the key of everything a pod has in
/// these maps.
#[inline(always)]
pub fn netns_cookie<C: EbpfContext>(ctx: &C) -> NetnsCookie {
    // SAFETY: the helper reads only the context it is handed, the program's own.
    NetnsCookie(unsafe { bpf_get_netns_cookie(ctx.as_ptr()) })
}

/// The pod's netns cookie as a sock_ops or getsockopt program finds it: from the helper,
/// or (`ON_CGROUP`) from the stamp on the cgroup it is attached at, so that the variant's
/// bytecode has no call the older verifier refuses.
#[inline(always)]
pub fn pod_cookie<const ON_CGROUP: bool, C: EbpfContext>(ctx: &C) -> NetnsCookie {
    if ON_CGROUP {
        // SAFETY: the helper's pointer is to this attachment's entry, valid for the run.
        unsafe { *POD_COOKIE.get_ptr_mut() }
    } else {
        netns_cookie(ctx)
    }
}

/// One pod's sets, looked up in the shared maps under its netns cookie.
pub struct PodMaps {
    pub netns_cookie: NetnsCookie,
}

impl PodLookups for PodMaps {
    #[inline(always)]
    fn port_in(&self, set: PortSet, port: u16) -> bool {
        // SAFETY: only tested for presence; the value is never read.
        unsafe { PORT_SETS.get(PortKey::new(self.netns_cookie.get(), set, port)) }.is_some()
    }

    #[inline(always)]
    fn cidr_value(&self, list: CidrList, ip: IpAddr) -> Option<u8> {
        match ip {
            IpAddr::V4(v4) => {
                let data = Cidr4Key::new(self.netns_cookie.get(), list, v4.octets());
                CIDRS_V4
                    .get(Key::new(CIDR_KEY_FIXED_BITS + 32, data))
                    .copied()
            }
            IpAddr::V6(v6) => {
                let data = Cidr6Key::new(self.netns_cookie.get(), list, v6.octets());
                CIDRS_V6
                    .get(Key::new(CIDR_KEY_FIXED_BITS + 128, data))
                    .copied()
            }
        }
    }
}
