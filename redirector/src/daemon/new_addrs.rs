//! Addresses pods gain after they were set up: a secondary IP, an interface a later
//! network plugin adds. Inbound connections find their pod by address, and sk_lookup has
//! no way to name the namespace it runs in, so the kernel side refuses a connection to an
//! address no pod was set up with and notes the address in `ADDR_MISSES`. Here the daemon
//! finds the recorded pod whose namespace has the address and sets it up again, which
//! adds the address: the client's retransmitted SYN then lands on the proxy.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use redirector_common::{names, PodAddrKey};

use crate::pods::{PodError, Pods};
use crate::{engine::facts, store::node_maps, sys::netns::Netns};

/// How often `ADDR_MISSES` is read: well inside TCP's first SYN retransmission (1 s).
pub const INTERVAL: Duration = Duration::from_millis(200);

/// How long an address no recorded pod has (an init-container pod's) is left alone.
const UNCLAIMED_FOR: Duration = Duration::from_secs(10);

/// The node object's `ADDR_MISSES`, and the addresses no recorded pod had when last
/// looked for.
#[derive(Default)]
pub struct Misses {
    map: Option<BpfHashMap<MapData, PodAddrKey, u32>>,
    unclaimed: HashMap<IpAddr, Instant>,
}

impl Misses {
    /// The addresses noted since the last call (taken out of the map: noted again if
    /// connections still come to them), less those no pod had a moment ago.
    pub fn take(&mut self, pods: &Pods) -> Vec<IpAddr> {
        if self.map.is_none() {
            self.map = node_maps::open(&pods.pins(), names::ADDR_MISSES).ok();
        }
        let Some(map) = &mut self.map else {
            return Vec::new();
        };
        let keys: Vec<PodAddrKey> = map.keys().filter_map(Result::ok).collect();
        for key in &keys {
            let _ = map.remove(key);
        }
        let now = Instant::now();
        self.unclaimed
            .retain(|_, since| now.duration_since(*since) < UNCLAIMED_FOR);
        keys.iter()
            .map(|k| k.addr.ip(k.family as u16))
            .filter(|ip| !self.unclaimed.contains_key(ip))
            .collect()
    }

    /// Addresses of `wanted` not in `claimed` are left alone for a while.
    pub fn unclaimed(&mut self, wanted: &[IpAddr], claimed: &[IpAddr]) {
        for ip in wanted.iter().filter(|ip| !claimed.contains(ip)) {
            tracing::warn!(
                "inbound connections to {ip}, an address of a captured namespace that no pod the daemon knows has: refused (an init-container pod's address added after its setup?)"
            );
            self.unclaimed.insert(*ip, Instant::now());
        }
    }
}

impl Pods {
    /// Sets up again each recorded pod whose namespace now has one of `wanted`; returns
    /// the addresses found.
    pub fn adopt_addresses(&self, wanted: &[IpAddr]) -> Vec<IpAddr> {
        let records = match self.records.all() {
            Ok(records) => records,
            Err(err) => {
                tracing::warn!("pods' new addresses: {err}");
                return Vec::new();
            }
        };
        let mut claimed = Vec::new();
        for record in records {
            let Ok(netns) = Netns::open(&record.netns) else {
                continue;
            };
            if netns.cookie() != record.cookie() {
                continue;
            }
            let Ok(Ok(addrs)) = netns.run(facts::local_addresses) else {
                continue;
            };
            let found: Vec<IpAddr> = wanted
                .iter()
                .filter(|a| addrs.contains(a))
                .copied()
                .collect();
            if found.is_empty() {
                continue;
            }
            let name = record
                .name
                .clone()
                .unwrap_or_else(|| format!("netns cookie {}", record.netns_cookie));
            let flags = record.flags();
            let added = crate::mesh::pod_spec(&flags)
                .map_err(PodError::from)
                .and_then(|spec| {
                    self.add(
                        &record.netns,
                        record.name.clone(),
                        (flags, &spec),
                        record.cni_attachment(),
                        record.cgroup.clone(),
                    )
                });
            match added {
                Ok(_) => tracing::info!("pod {name} has new address(es) {found:?}: set up again"),
                Err(err) => tracing::warn!("adding address(es) {found:?} to pod {name}: {err}"),
            }
            claimed.extend(found);
        }
        claimed
    }
}
