//! The map keys a pod's apply wrote, kept with the pod so that observing and removing it
//! looks its own entries up instead of reading the node-wide maps through: the time a
//! removal or a change takes does not grow with the node's pods.
//!
//! The daemon keeps them in the pod's record ([`crate::daemon::records`]). A record says
//! what an apply may have written: before an apply writes a key the record does not hold,
//! the record is saved with it (see [`PodKeys::covers`]), so a run killed in between leaves
//! nothing the next removal does not look up. Every key is looked up before it counts, so a
//! record that says more than the maps hold is harmless. Pods without a record
//! (init-container pods, records of earlier releases) are observed by reading the maps
//! through, as are pods that are gone, which garbage collection finds and removes.

use std::net::IpAddr;

use redirector_common::{
    Cidr4Key, Cidr6Key, NetnsCookie, PodAddrKey, PortKey, RawIp, AF_INET, AF_INET6,
    CIDR_KEY_FIXED_BITS,
};
use serde::{Deserialize, Serialize};

use crate::engine::plan::{CidrEntry, PodPlan};

/// A pod's keys without its netns cookie, which each entry holds (a compact record: a
/// standard injection's keys are about 100 bytes of JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodKeys {
    /// `PORT_SETS`: (set, port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<(u16, u16)>,
    /// `CIDRS_V4` and `CIDRS_V6`: (list, address, prefix length of the address).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<(u32, IpAddr, u8)>,
    /// `POD_BY_ADDR`: the pod's addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addrs: Vec<IpAddr>,
}

impl PodKeys {
    /// The keys an apply of `plan` writes.
    pub fn of(plan: &PodPlan) -> Self {
        let v4 = plan.cidrs_v4.iter().map(|e| {
            let ip = IpAddr::from(e.data.addr);
            (e.data.list, ip, address_bits(e))
        });
        let v6 = plan.cidrs_v6.iter().map(|e| {
            let ip = IpAddr::from(e.data.addr);
            (e.data.list, ip, address_bits(e))
        });
        let mut keys = PodKeys {
            ports: plan.ports.iter().map(|k| (k.set, k.port)).collect(),
            cidrs: v4.chain(v6).collect(),
            addrs: plan
                .addrs
                .iter()
                .map(|a| a.addr.ip(a.family as u16))
                .collect(),
        };
        keys.normalise();
        keys
    }

    /// Sorted and without duplicates, so that records compare and read the same.
    fn normalise(&mut self) {
        self.ports.sort_unstable();
        self.ports.dedup();
        self.cidrs.sort_unstable();
        self.cidrs.dedup();
        self.addrs.sort_unstable();
        self.addrs.dedup();
    }

    /// Whether every key of `other` is among these: if not, a record of these keys must
    /// first take `other`'s too ([`Self::union`]) before an apply writes them.
    pub fn covers(&self, other: &PodKeys) -> bool {
        other.ports.iter().all(|k| self.ports.contains(k))
            && other.cidrs.iter().all(|k| self.cidrs.contains(k))
            && other.addrs.iter().all(|k| self.addrs.contains(k))
    }

    pub fn union(&self, other: &PodKeys) -> PodKeys {
        let mut keys = self.clone();
        keys.ports.extend(&other.ports);
        keys.cidrs.extend(&other.cidrs);
        keys.addrs.extend(&other.addrs);
        keys.normalise();
        keys
    }

    pub fn port_keys(&self, cookie: NetnsCookie) -> impl Iterator<Item = PortKey> + '_ {
        self.ports.iter().map(move |&(set, port)| PortKey {
            netns_cookie: cookie.get(),
            port,
            set,
            _pad: 0,
        })
    }

    /// The IPv4 LPM-trie keys, as (prefix length, data).
    pub fn cidr4_keys(&self, cookie: NetnsCookie) -> impl Iterator<Item = (u32, Cidr4Key)> + '_ {
        self.cidrs
            .iter()
            .filter_map(move |&(list, ip, bits)| match ip {
                IpAddr::V4(v4) => Some((
                    CIDR_KEY_FIXED_BITS + u32::from(bits),
                    Cidr4Key {
                        netns_cookie: cookie.get(),
                        list,
                        addr: v4.octets(),
                    },
                )),
                IpAddr::V6(_) => None,
            })
    }

    /// The IPv6 LPM-trie keys, as (prefix length, data).
    pub fn cidr6_keys(&self, cookie: NetnsCookie) -> impl Iterator<Item = (u32, Cidr6Key)> + '_ {
        self.cidrs
            .iter()
            .filter_map(move |&(list, ip, bits)| match ip {
                IpAddr::V6(v6) => Some((
                    CIDR_KEY_FIXED_BITS + u32::from(bits),
                    Cidr6Key {
                        netns_cookie: cookie.get(),
                        list,
                        addr: v6.octets(),
                        _pad: 0,
                    },
                )),
                IpAddr::V4(_) => None,
            })
    }

    pub fn addr_keys(&self) -> impl Iterator<Item = PodAddrKey> + '_ {
        self.addrs.iter().map(|&ip| PodAddrKey {
            addr: RawIp::from_ip(ip),
            family: u32::from(if ip.is_ipv4() { AF_INET } else { AF_INET6 }),
        })
    }
}

/// The prefix length of an entry's address, without the fixed cookie and list bits.
fn address_bits<K>(entry: &CidrEntry<K>) -> u8 {
    entry.prefix_len.saturating_sub(CIDR_KEY_FIXED_BITS) as u8
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{
        engine::facts::PodFacts, engine::plan::plan_pod, mesh::istio::parse_istio_iptables,
    };

    fn plan(args: &[&str]) -> PodPlan {
        let argv = std::iter::once("istio-iptables").chain(args.iter().copied());
        let cfg = parse_istio_iptables(argv, &HashMap::<String, String>::new()).unwrap();
        let facts = PodFacts {
            netns_cookie: NetnsCookie(42),
            local_addrs: vec!["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            cgroup: None,
            interfaces: vec![("lo".into(), 1), ("eth0".into(), 2)],
            dns_servers: Vec::new(),
            routes: Vec::new(),
            ids: None,
        };
        plan_pod(&cfg.capture, &facts)
    }

    #[test]
    fn the_keys_of_a_plan_are_its_map_keys() {
        let plan = plan(&[
            "-d",
            "15090,15021",
            "-x",
            "10.0.0.0/8,fd01::/64",
            "-o",
            "9000",
        ]);
        let keys = PodKeys::of(&plan);
        let cookie = plan.netns_cookie;
        let mut ports: Vec<_> = keys.port_keys(cookie).collect();
        let mut planned = plan.ports.clone();
        ports.sort_by_key(|k| (k.set, k.port));
        planned.sort_by_key(|k| (k.set, k.port));
        assert_eq!(ports, planned);
        let v4: Vec<_> = keys.cidr4_keys(cookie).collect();
        assert_eq!(v4.len(), plan.cidrs_v4.len());
        for e in &plan.cidrs_v4 {
            assert!(v4.contains(&(e.prefix_len, e.data)), "{e:?}");
        }
        let v6: Vec<_> = keys.cidr6_keys(cookie).collect();
        assert_eq!(v6.len(), plan.cidrs_v6.len());
        for e in &plan.cidrs_v6 {
            assert!(v6.contains(&(e.prefix_len, e.data)), "{e:?}");
        }
        let addrs: Vec<_> = keys.addr_keys().collect();
        assert_eq!(addrs.len(), plan.addrs.len());
        assert!(plan.addrs.iter().all(|a| addrs.contains(a)));
    }

    #[test]
    fn a_union_covers_both_and_survives_a_record() {
        let old = PodKeys::of(&plan(&["-d", "15090", "-x", "10.0.0.0/8"]));
        let new = PodKeys::of(&plan(&["-d", "15021"]));
        assert!(!old.covers(&new) && !new.covers(&old));
        let both = old.union(&new);
        assert!(both.covers(&old) && both.covers(&new) && both.covers(&both));
        let json = serde_json::to_string(&both).unwrap();
        assert_eq!(serde_json::from_str::<PodKeys>(&json).unwrap(), both);
    }
}
