//! A pod as the kernel sees it: its entries in the pinned maps of the object it uses.

use std::net::IpAddr;

use aya::maps::lpm_trie::Key;
use redirector_common::{
    Cidr4Key, Cidr6Key, CidrList, Counters, NetnsCookie, PodConfig, PodLookups, PortKey, PortSet,
    CIDR_KEY_FIXED_BITS, COUNTER_SLOTS,
};

use crate::{
    store::{NodeMaps, ObjectPins, OpenMapError, PinRoot},
    sys::fs_error::{fs_err, FsError},
};

#[derive(Debug, thiserror::Error)]
pub enum LivePodError {
    #[error(transparent)]
    Objects(#[from] FsError),
    #[error(transparent)]
    OpenMap(#[from] OpenMapError),
    #[error("pod with netns cookie {0} is not set up under this pin root")]
    NotFound(NetnsCookie),
}

pub struct LivePod {
    pub netns_cookie: NetnsCookie,
    pub object: ObjectPins,
    pub maps: NodeMaps,
    pub config: PodConfig,
}

impl LivePod {
    /// The pod with this netns cookie, under whichever object holds its links.
    pub fn open(root: &PinRoot, netns_cookie: NetnsCookie) -> Result<Self, LivePodError> {
        for object in root
            .objects()
            .map_err(fs_err("listing", &root.objects_dir()))?
        {
            let pod = object.pod(netns_cookie);
            if !pod.is_linked().map_err(fs_err("reading", pod.dir()))? {
                continue;
            }
            let maps = NodeMaps::open(&object)?;
            let Ok(config) = maps.pod_config.get(&netns_cookie, 0) else {
                continue;
            };
            return Ok(LivePod {
                netns_cookie,
                object,
                maps,
                config,
            });
        }
        Err(LivePodError::NotFound(netns_cookie))
    }

    /// Decision counters summed over CPUs, by counter slot.
    pub fn counters(&self) -> [u64; COUNTER_SLOTS] {
        counters_of(&self.maps, self.netns_cookie)
    }
}

/// A pod's decision counters in `maps`, summed over CPUs, by counter slot (zeros when it
/// has none).
pub fn counters_of(maps: &NodeMaps, netns_cookie: NetnsCookie) -> [u64; COUNTER_SLOTS] {
    let mut total = [0; COUNTER_SLOTS];
    if let Ok(per_cpu) = maps.counters.get(&netns_cookie, 0) {
        for cpu in per_cpu.iter() {
            let cpu: &Counters = cpu;
            for (t, v) in total.iter_mut().zip(cpu.by_reason) {
                *t += v;
            }
        }
    }
    total
}

/// Lookups the kernel programs make, made the same way from user space.
impl PodLookups for LivePod {
    fn port_in(&self, set: PortSet, port: u16) -> bool {
        self.maps
            .port_sets
            .get(&PortKey::new(self.netns_cookie.get(), set, port), 0)
            .is_ok()
    }

    fn cidr_value(&self, list: CidrList, addr: IpAddr) -> Option<u8> {
        match addr {
            IpAddr::V4(v4) => {
                let data = Cidr4Key::new(self.netns_cookie.get(), list, v4.octets());
                self.maps
                    .cidrs_v4
                    .get(&Key::new(CIDR_KEY_FIXED_BITS + 32, data), 0)
                    .ok()
            }
            IpAddr::V6(v6) => {
                let data = Cidr6Key::new(self.netns_cookie.get(), list, v6.octets());
                self.maps
                    .cidrs_v6
                    .get(&Key::new(CIDR_KEY_FIXED_BITS + 128, data), 0)
                    .ok()
            }
        }
    }
}
