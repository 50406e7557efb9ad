//! Typed handles on the pinned maps of one object.

use aya::maps::{HashMap, LpmTrie, Map, MapData, SockHash};
use redirector_common::{
    names, Cidr4Key, Cidr6Key, ConnKey, Counters, ListenerKey, NetnsCookie, OrigDst, PodAddrKey,
    PodConfig, PortKey,
};

use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use super::{
    growing::{GrowingHash, GrowingPerCpuHash},
    pins::ObjectPins,
};
use crate::sys::bpf_sys;

#[derive(Debug, thiserror::Error)]
#[error("opening pinned map {name} at {path}: {source}")]
pub struct OpenMapError {
    name: &'static str,
    path: String,
    source: aya::maps::MapError,
}

/// The maps every pod on a node shares, keyed by netns cookie. A pod's configuration and
/// its counters are the values that grow between releases ([`super::growing`]).
pub struct NodeMaps {
    pub pod_config: GrowingHash<NetnsCookie, PodConfig>,
    pub port_sets: HashMap<MapData, PortKey, u8>,
    pub cidrs_v4: LpmTrie<MapData, Cidr4Key, u8>,
    pub cidrs_v6: LpmTrie<MapData, Cidr6Key, u8>,
    pub orig_dst_by_conn: HashMap<MapData, ConnKey, OrigDst>,
    /// socket cookie → original destination, between connect() and the handshake.
    pub orig_dst_by_cookie: HashMap<MapData, u64, OrigDst>,
    /// UDP socket cookie → where its DNS query went.
    pub dns_orig_by_cookie: HashMap<MapData, u64, OrigDst>,
    pub counters: GrowingPerCpuHash<NetnsCookie, Counters>,
    pub pod_by_addr: HashMap<MapData, PodAddrKey, NetnsCookie>,
    pub listeners: SockHash<MapData, ListenerKey>,
}

/// The maps of a node's objects, kept open from one call to the next: the daemon keeps
/// them for its lifetime, a one-shot command for one apply. Kept maps are used again only
/// while the object's pins still hold them (an object removed and loaded again has new
/// maps), which one map's id tells: two bpf calls where opening them all takes twenty.
#[derive(Default)]
pub struct OpenMaps(Vec<Kept>);

struct Kept {
    object: PathBuf,
    /// The id of the object's POD_CONFIG map when these maps were opened.
    pod_config_id: u32,
    maps: NodeMaps,
}

impl OpenMaps {
    /// The maps of `object`: the kept ones if its pins still hold them, else opened anew.
    pub fn get(&mut self, object: &ObjectPins) -> Result<&mut NodeMaps, OpenMapError> {
        let pod_config_id = pinned_map_id(object, names::POD_CONFIG)?;
        let kept = (self.0.iter())
            .position(|k| k.object == object.dir() && k.pod_config_id == pod_config_id);
        let index = match kept {
            Some(i) => i,
            None => {
                self.0.retain(|k| k.object != object.dir());
                self.0.push(Kept {
                    object: object.dir().to_path_buf(),
                    pod_config_id,
                    maps: NodeMaps::open(object)?,
                });
                self.0.len() - 1
            }
        };
        Ok(&mut self.0[index].maps)
    }

    /// Lets go of the maps of objects that are no longer loaded.
    pub fn retain_loaded(&mut self, loaded: &[ObjectPins]) {
        self.0
            .retain(|k| loaded.iter().any(|o| o.dir() == k.object));
    }
}

fn pinned_map_id(pins: &ObjectPins, name: &'static str) -> Result<u32, OpenMapError> {
    let path = pins.map(name);
    aya::maps::MapInfo::from_pin(&path)
        .map(|info| info.id())
        .map_err(open_err(name, &path))
}

fn open_err<'a>(
    name: &'static str,
    path: &'a Path,
) -> impl Fn(aya::maps::MapError) -> OpenMapError + Copy + 'a {
    move |source| OpenMapError {
        name,
        path: path.display().to_string(),
        source,
    }
}

/// Every entry of a hash map (not per-CPU), read in batches: a bpf call per thousands of
/// entries, where walking its keys takes one or two per entry.
pub fn hash_entries<K: bytemuck::Pod, V: bytemuck::Pod>(
    map: &MapData,
) -> Result<Vec<(K, V)>, aya::maps::MapError> {
    let (key_size, value_size) = (size_of::<K>(), size_of::<V>());
    let (keys, values) =
        bpf_sys::hash_entries(map.fd().as_fd(), key_size, value_size).map_err(|io_error| {
            aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_lookup_batch",
                io_error,
            })
        })?;
    Ok(keys
        .chunks_exact(key_size)
        .zip(values.chunks_exact(value_size))
        .map(|(k, v)| {
            (
                bytemuck::pod_read_unaligned(k),
                bytemuck::pod_read_unaligned(v),
            )
        })
        .collect())
}

/// The map `name` of the object `pins`, as the map type `T`.
pub fn open<T>(pins: &ObjectPins, name: &'static str) -> Result<T, OpenMapError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    let path = pins.map(name);
    let err = open_err(name, &path);
    let data = MapData::from_pin(&path).map_err(err)?;
    let map = Map::from_map_data(data).map_err(err)?;
    T::try_from(map).map_err(err)
}

/// The map `name` of the object `pins`, values at the map's own size.
fn open_growing<T>(
    pins: &ObjectPins,
    name: &'static str,
    new: impl FnOnce(MapData) -> Result<T, aya::maps::MapError>,
) -> Result<T, OpenMapError> {
    let path = pins.map(name);
    let err = open_err(name, &path);
    new(MapData::from_pin(&path).map_err(err)?).map_err(err)
}

impl NodeMaps {
    /// Entries and capacity of each map of an object: (name, entries, capacity).
    pub fn fill(object: &ObjectPins) -> Result<Vec<(&'static str, usize, u32)>, OpenMapError> {
        let maps = NodeMaps::open(object)?;
        let capacity = |name: &str| {
            MapData::from_pin(object.map(name))
                .ok()
                .and_then(|m| m.info().ok())
                .map_or(0, |i| i.max_entries())
        };
        Ok(vec![
            (
                names::POD_CONFIG,
                maps.pod_config.keys().count(),
                capacity(names::POD_CONFIG),
            ),
            (
                names::PORT_SETS,
                maps.port_sets.keys().count(),
                capacity(names::PORT_SETS),
            ),
            (
                names::CIDRS_V4,
                maps.cidrs_v4.keys().count(),
                capacity(names::CIDRS_V4),
            ),
            (
                names::CIDRS_V6,
                maps.cidrs_v6.keys().count(),
                capacity(names::CIDRS_V6),
            ),
            (
                names::POD_BY_ADDR,
                maps.pod_by_addr.keys().count(),
                capacity(names::POD_BY_ADDR),
            ),
            (
                names::LISTENERS,
                maps.listeners.keys().count(),
                capacity(names::LISTENERS),
            ),
            (
                names::ORIG_DST_BY_CONN,
                maps.orig_dst_by_conn.keys().count(),
                capacity(names::ORIG_DST_BY_CONN),
            ),
            (
                names::COUNTERS,
                maps.counters.keys().count(),
                capacity(names::COUNTERS),
            ),
        ])
    }

    pub fn open(pins: &ObjectPins) -> Result<Self, OpenMapError> {
        Ok(NodeMaps {
            pod_config: open_growing(pins, names::POD_CONFIG, GrowingHash::new)?,
            port_sets: open(pins, names::PORT_SETS)?,
            cidrs_v4: open(pins, names::CIDRS_V4)?,
            cidrs_v6: open(pins, names::CIDRS_V6)?,
            orig_dst_by_conn: open(pins, names::ORIG_DST_BY_CONN)?,
            orig_dst_by_cookie: open(pins, names::ORIG_DST_BY_COOKIE)?,
            dns_orig_by_cookie: open(pins, names::DNS_ORIG_BY_COOKIE)?,
            counters: open_growing(pins, names::COUNTERS, GrowingPerCpuHash::new)?,
            pod_by_addr: open(pins, names::POD_BY_ADDR)?,
            listeners: open(pins, names::LISTENERS)?,
        })
    }
}
