//! What is installed for a pod, read from bpffs and the kernel, in the shape of its plan.
//!
//! A pod's entries are found by looking up the keys it is known to have written
//! ([`Lookup::Keys`], [`crate::engine::pod_keys`]): a few bpf calls a key, whatever the node
//! holds. A pod whose keys are kept nowhere is found by reading the node-wide maps through
//! ([`Lookup::ReadThrough`]) — but only if it is installed at all: a pod that has neither
//! links nor a configuration under an object has nothing there, so setting up a new pod
//! reads no node-wide map beyond one lookup per object. Garbage collection reads each map
//! once for all the pods it removes ([`observe_pods`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::AsFd as _,
};

use aya::maps::{IterableMap as _, LpmTrie, MapData, MapError};
use redirector_common::{
    pod_flags, Cidr4Key, Cidr6Key, ConnKey, ListenerKey, NetnsCookie, OrigDst, PodAddrKey,
    PodConfig, PortKey,
};

use crate::sys::bpf_sys::{lpm_contains, lpm_first, pinned_link_target, LinkTarget};
use crate::{
    engine::plan::CidrEntry,
    engine::pod_keys::PodKeys,
    store::{node_maps::hash_entries, NodeMaps, ObjectPins, OpenMapError, OpenMaps, PinRoot},
    sys::fs_error::{fs_err, FsError},
};

#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    OpenMap(#[from] OpenMapError),
    #[error("reading {map}: {source}")]
    MapRead { map: &'static str, source: MapError },
}

fn read_err(map: &'static str) -> impl FnOnce(MapError) -> ObserveError {
    move |source| ObserveError::MapRead { map, source }
}

/// A pod's pinned link: the hook it is pinned under and what the kernel says it is
/// attached to (`None` when the pin cannot be read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedLink {
    pub hook: String,
    pub target: Option<LinkTarget>,
}

impl ObservedLink {
    /// A link whose cgroup or network namespace is gone is pinned but attached to nothing.
    pub fn attached(&self) -> bool {
        self.target.is_none_or(LinkTarget::attached)
    }
}

/// What one object holds for a pod: the plan's entries and links, and the entries the
/// kernel side made for it at run time (listeners, redirected connections).
#[derive(Clone, Debug)]
pub struct Installation {
    pub object: ObjectPins,
    pub config: Option<PodConfig>,
    pub counters: bool,
    pub ports: Vec<PortKey>,
    pub cidrs_v4: Vec<CidrEntry<Cidr4Key>>,
    pub cidrs_v6: Vec<CidrEntry<Cidr6Key>>,
    pub addrs: Vec<PodAddrKey>,
    pub links: Vec<ObservedLink>,
    pub listeners: Vec<ListenerKey>,
    pub connections: Vec<ConnKey>,
}

impl Installation {
    pub fn empty(object: ObjectPins) -> Self {
        Installation {
            object,
            config: None,
            counters: false,
            ports: Vec::new(),
            cidrs_v4: Vec::new(),
            cidrs_v6: Vec::new(),
            addrs: Vec::new(),
            links: Vec::new(),
            listeners: Vec::new(),
            connections: Vec::new(),
        }
    }

    /// Whether every link is detached: the pod's cgroup and network namespace are gone.
    pub fn all_links_detached(&self) -> bool {
        !self.links.iter().any(ObservedLink::attached)
    }
}

/// Everything installed for one pod, under every object (normally one; two while a pod
/// moves to a new object).
#[derive(Clone, Debug)]
pub struct PodState {
    pub netns_cookie: NetnsCookie,
    pub installations: Vec<Installation>,
}

impl PodState {
    pub fn is_empty(&self) -> bool {
        self.installations.is_empty()
    }
}

/// How a pod's entries are found.
#[derive(Clone, Copy, Debug)]
pub enum Lookup<'a> {
    /// Each of these keys is looked up: the keys the pod's applies wrote and those its
    /// plan has ([`PodKeys`]), so that the time it takes does not grow with the node's
    /// pods.
    Keys(&'a PodKeys),
    /// The node-wide maps are read through, when the pod is configured: its keys are kept
    /// nowhere (an init container's pod, a record of an earlier release).
    ReadThrough,
}

/// Read what is installed for the pod with this netns cookie: its links and the entries
/// user space wrote for it, found as `lookup` says. The entries the kernel made for it
/// (listeners, redirected connections) are not read: finding them means reading
/// node-wide maps through, and they go by themselves — a listener's when its socket
/// closes, a connection's when the app's socket (inbound: the proxy's) closes or, unused,
/// when newer connections need the room (a connection already redirected keeps its
/// original destination, as conntrack keeps its entries when iptables rules are removed).
/// Each object's maps are taken from `maps`, which keeps them open for the apply that
/// follows and, in the daemon, for the next pod.
pub fn observe(
    root: &PinRoot,
    netns_cookie: NetnsCookie,
    maps: &mut OpenMaps,
    lookup: Lookup,
) -> Result<PodState, ObserveError> {
    let objects = root
        .objects()
        .map_err(fs_err("listing", &root.objects_dir()))?;
    maps.retain_loaded(&objects);
    let one = BTreeSet::from([netns_cookie]);
    let mut installations = Vec::new();
    for object in objects {
        let links = observe_links(&object, netns_cookie)?;
        let node_maps = maps.get(&object)?;
        let found = match lookup {
            Lookup::Keys(keys) => observe_keys(&object, node_maps, netns_cookie, keys)?,
            Lookup::ReadThrough => {
                observe_pods(&object, node_maps, &Pods::These(&one), false)?.remove(&netns_cookie)
            }
        };
        if links.is_empty() && found.is_none() {
            continue;
        }
        let mut install = found.unwrap_or_else(|| Installation::empty(object.clone()));
        install.links = links;
        installations.push(install);
    }
    Ok(PodState {
        netns_cookie,
        installations,
    })
}

/// The pod's configuration and whether it has counters; `None` when it has neither.
fn configured(
    maps: &NodeMaps,
    cookie: NetnsCookie,
) -> Result<Option<(Option<PodConfig>, bool)>, ObserveError> {
    let config = maps
        .pod_config
        .get(&cookie, 0)
        .map(Some)
        .or_else(absent)
        .map_err(read_err("POD_CONFIG"))?;
    let counters = maps
        .counters
        .get(&cookie, 0)
        .map(Some)
        .or_else(absent)
        .map_err(read_err("COUNTERS"))?
        .is_some();
    Ok((config.is_some() || counters).then_some((config.map(as_planned), counters)))
}

/// The entries one object holds for the pod among `keys`, each looked up on its own:
/// a few bpf calls per key, whatever the node holds. Unlike a read-through, entries are
/// found even when the pod has no configuration left (a removal killed after it).
fn observe_keys(
    object: &ObjectPins,
    maps: &NodeMaps,
    cookie: NetnsCookie,
    keys: &PodKeys,
) -> Result<Option<Installation>, ObserveError> {
    let mut install = Installation::empty(object.clone());
    if let Some((config, counters)) = configured(maps, cookie)? {
        install.config = config;
        install.counters = counters;
    }
    for key in keys.port_keys(cookie) {
        if maps
            .port_sets
            .get(&key, 0)
            .map(Some)
            .or_else(absent)
            .map_err(read_err("PORT_SETS"))?
            .is_some()
        {
            install.ports.push(key);
        }
    }
    install.cidrs_v4 = held_cidrs(&maps.cidrs_v4, "CIDRS_V4", keys.cidr4_keys(cookie))?;
    install.cidrs_v6 = held_cidrs(&maps.cidrs_v6, "CIDRS_V6", keys.cidr6_keys(cookie))?;
    for key in keys.addr_keys() {
        let owner = maps
            .pod_by_addr
            .get(&key, 0)
            .map(Some)
            .or_else(absent)
            .map_err(read_err("POD_BY_ADDR"))?;
        // An address another pod took since is that pod's.
        if owner == Some(cookie) {
            install.addrs.push(key);
        }
    }
    let empty = install.config.is_none()
        && !install.counters
        && install.ports.is_empty()
        && install.cidrs_v4.is_empty()
        && install.cidrs_v6.is_empty()
        && install.addrs.is_empty();
    Ok((!empty).then_some(install))
}

/// The entries among `keys` an LPM trie holds exactly, with their values.
fn held_cidrs<K: aya::Pod + bytemuck::Pod + PartialEq>(
    trie: &LpmTrie<MapData, K, u8>,
    map: &'static str,
    keys: impl Iterator<Item = (u32, K)>,
) -> Result<Vec<CidrEntry<K>>, ObserveError> {
    let fd = trie.map().fd().as_fd();
    let io_err = |err: std::io::Error| ObserveError::MapRead {
        map,
        source: MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_get_next_key",
            io_error: err,
        }),
    };
    let mut first = None;
    let mut held = Vec::new();
    for (prefix_len, data) in keys {
        let first = match first {
            Some(first) => first,
            None => *first.insert(lpm_first::<K>(fd).map_err(io_err)?),
        };
        if !lpm_contains(fd, first, prefix_len, data).map_err(io_err)? {
            continue;
        }
        // Held exactly, so the longest match is the entry itself. Kernels before the fix of
        // trie_get_next_key's exact match (6.13; Debian 11's 5.10 lacks it) walk on from a
        // key of the same length met on the way to an absent one, so there the answer can
        // be "held" for a key no entry covers: the lookup finds nothing, and it is not held.
        let Some(value) = trie
            .get(&aya::maps::lpm_trie::Key::new(prefix_len, data), 0)
            .map(Some)
            .or_else(absent)
            .map_err(read_err(map))?
        else {
            continue;
        };
        held.push(CidrEntry {
            prefix_len,
            data,
            value,
        });
    }
    Ok(held)
}

/// Which pods [`observe_pods`] collects.
pub enum Pods<'a> {
    /// These pods (one, to observe it; a few that are gone, to remove them): the maps keyed
    /// by netns cookie alone are looked up, not read through, and the others are read only
    /// if one of them is configured.
    These(&'a BTreeSet<NetnsCookie>),
    /// Every pod but these (garbage collection).
    AllBut(&'a BTreeSet<NetnsCookie>),
}

impl Pods<'_> {
    fn wants(&self, cookie: NetnsCookie) -> bool {
        match self {
            Pods::These(these) => these.contains(&cookie),
            Pods::AllBut(live) => !live.contains(&cookie),
        }
    }
}

/// The installation of `cookie` in `found`, made on first use, if the pod is wanted.
fn slot<'a>(
    found: &'a mut BTreeMap<NetnsCookie, Installation>,
    object: &ObjectPins,
    pods: &Pods,
    cookie: NetnsCookie,
) -> Option<&'a mut Installation> {
    pods.wants(cookie).then(|| {
        found
            .entry(cookie)
            .or_insert_with(|| Installation::empty(object.clone()))
    })
}

/// Every entry of an LPM trie, with the pod it belongs to.
fn cidr_entries<K: aya::Pod>(
    trie: &LpmTrie<MapData, K, u8>,
    map: &'static str,
    cookie_of: fn(&K) -> u64,
) -> Result<Vec<(NetnsCookie, CidrEntry<K>)>, ObserveError> {
    trie.iter()
        .map(|item| {
            let (key, value) = item.map_err(read_err(map))?;
            let data = key.data();
            let entry = CidrEntry {
                prefix_len: key.prefix_len(),
                data,
                value,
            };
            Ok((NetnsCookie(cookie_of(&data)), entry))
        })
        .collect()
}

/// `Ok(None)` for a missing key, so that only real failures are errors.
fn absent<T>(err: MapError) -> Result<Option<T>, MapError> {
    match err {
        MapError::KeyNotFound => Ok(None),
        err => Err(err),
    }
}

/// The links pinned for a pod under an object, with what each is attached to.
pub fn observe_links(
    object: &ObjectPins,
    netns_cookie: NetnsCookie,
) -> Result<Vec<ObservedLink>, ObserveError> {
    let pod = object.pod(netns_cookie);
    let hooks = pod.hooks().map_err(fs_err("listing", pod.dir()))?;
    Ok(hooks
        .into_iter()
        .map(|hook| ObservedLink {
            target: pinned_link_target(&pod.link(&hook)).ok(),
            hook,
        })
        .collect())
}

/// A live configuration as an apply plans it: `redirector trace`'s switch is not part of
/// the pod's spec, so a pod being traced does not read as changed (an apply with nothing
/// else to change leaves the switch as it is; one that rewrites the entry drops it, and the
/// tracer sets it again).
fn as_planned(mut config: PodConfig) -> PodConfig {
    config.flags &= !pod_flags::TRACE;
    config
}

/// The map entries one object holds for the selected pods, reading each map at most once
/// (links are read separately, by [`observe_links`]); with `runtime`, also the entries
/// the kernel side made (listeners, redirected connections). Pods with no entries are
/// left out.
pub fn observe_pods(
    object: &ObjectPins,
    maps: &NodeMaps,
    pods: &Pods,
    runtime: bool,
) -> Result<BTreeMap<NetnsCookie, Installation>, ObserveError> {
    let mut found: BTreeMap<NetnsCookie, Installation> = BTreeMap::new();
    match pods {
        Pods::These(cookies) => {
            for cookie in *cookies {
                let Some((config, counters)) = configured(maps, *cookie)? else {
                    continue;
                };
                let install = slot(&mut found, object, pods, *cookie).expect("a selected pod");
                install.config = config;
                install.counters = counters;
            }
            if found.is_empty() {
                // Not configured here: apply writes both before any link, and removal
                // drops both only after the links, so nothing else of these pods is here
                // (what an interrupted run leaves, gc collects).
                return Ok(found);
            }
        }
        Pods::AllBut(_) => {
            for item in maps.pod_config.iter() {
                let (cookie, config) = item.map_err(read_err("POD_CONFIG"))?;
                if let Some(install) = slot(&mut found, object, pods, cookie) {
                    install.config = Some(as_planned(config));
                }
            }
            for cookie in maps.counters.keys() {
                let cookie = cookie.map_err(read_err("COUNTERS"))?;
                if let Some(install) = slot(&mut found, object, pods, cookie) {
                    install.counters = true;
                }
            }
        }
    }
    let ports: Vec<(PortKey, u8)> =
        hash_entries(maps.port_sets.map()).map_err(read_err("PORT_SETS"))?;
    for (key, _) in ports {
        if let Some(install) = slot(&mut found, object, pods, NetnsCookie(key.netns_cookie)) {
            install.ports.push(key);
        }
    }
    for (cookie, e) in cidr_entries(&maps.cidrs_v4, "CIDRS_V4", |k| k.netns_cookie)? {
        if let Some(install) = slot(&mut found, object, pods, cookie) {
            install.cidrs_v4.push(e);
        }
    }
    for (cookie, e) in cidr_entries(&maps.cidrs_v6, "CIDRS_V6", |k| k.netns_cookie)? {
        if let Some(install) = slot(&mut found, object, pods, cookie) {
            install.cidrs_v6.push(e);
        }
    }
    let addrs: Vec<(PodAddrKey, NetnsCookie)> =
        hash_entries(maps.pod_by_addr.map()).map_err(read_err("POD_BY_ADDR"))?;
    for (key, cookie) in addrs {
        if let Some(install) = slot(&mut found, object, pods, cookie) {
            install.addrs.push(key);
        }
    }
    if !runtime {
        return Ok(found);
    }
    for key in maps.listeners.keys() {
        let key = key.map_err(read_err("LISTENERS"))?;
        if let Some(install) = slot(&mut found, object, pods, NetnsCookie(key.netns_cookie)) {
            install.listeners.push(key);
        }
    }
    let connections: Vec<(ConnKey, OrigDst)> =
        hash_entries(maps.orig_dst_by_conn.map()).map_err(read_err("ORIG_DST_BY_CONN"))?;
    for (key, _) in connections {
        if let Some(install) = slot(&mut found, object, pods, NetnsCookie(key.netns_cookie)) {
            install.connections.push(key);
        }
    }
    Ok(found)
}

/// How to find a pod's entries: by its keys when they are known.
pub(crate) fn lookup(keys: Option<&PodKeys>) -> Lookup<'_> {
    keys.map_or(Lookup::ReadThrough, Lookup::Keys)
}
