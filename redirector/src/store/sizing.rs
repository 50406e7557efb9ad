//! How many pods the node's object is sized for (`redirector daemon --max-pods`): the
//! maps whose entries belong to pods get capacities in proportion at load, and the maps
//! of connections keep the shipped ones ([`redirector_common::capacity`], sized for
//! [`capacity::PODS`]).
//!
//! A sized object is another object to the kernel, so it has another id: the size is
//! mixed into the hash of the bytes (the shipped size leaves the id as it was, so nodes
//! that never set the option keep their object). A node runs one object, and init
//! containers and CNI plugins use the one pinned with the node's links, whatever its
//! size; a daemon started with another size moves the node to it like an upgrade.

use redirector_common::{capacity, identity::object_hash, names};

/// The most pods an object is sized for: beyond it the maps' bucket arrays alone would
/// lock hundreds of MiB.
pub const MOST_PODS: u32 = 65_536;

/// The pods an object's maps hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodCapacity(u32);

/// The maps sized by the pods, and their shipped capacities.
const PER_POD_MAPS: [(&str, u32); 7] = [
    (names::POD_CONFIG, capacity::PODS),
    (names::COUNTERS, capacity::PODS),
    (names::LISTENERS, capacity::LISTENERS),
    (names::PORT_SETS, capacity::PORT_ENTRIES),
    (names::POD_BY_ADDR, capacity::POD_ADDRS),
    (names::CIDRS_V4, capacity::CIDR_ENTRIES),
    (names::CIDRS_V6, capacity::CIDR_ENTRIES),
];

impl PodCapacity {
    /// The object as built.
    pub const SHIPPED: PodCapacity = PodCapacity(capacity::PODS);

    /// `pods`, if an object can be sized for it; why not otherwise.
    pub fn new(pods: u32) -> Result<Self, String> {
        match pods {
            0 => Err("a node must hold at least 1 pod".into()),
            n if n > MOST_PODS => Err(format!(
                "at most {MOST_PODS} pods (the maps for {n} would lock hundreds of MiB)"
            )),
            n => Ok(PodCapacity(n)),
        }
    }

    pub fn pods(self) -> u32 {
        self.0
    }

    /// Each per-pod map's capacity: the shipped one, times the pods over the shipped pods.
    pub fn map_capacities(self) -> impl Iterator<Item = (&'static str, u32)> {
        PER_POD_MAPS.into_iter().map(move |(name, shipped)| {
            let scaled =
                (u64::from(shipped) * u64::from(self.0)).div_ceil(u64::from(capacity::PODS));
            (name, scaled as u32)
        })
    }

    /// The id of an object of bytes hashing to `hash`, sized for these pods.
    pub fn object_hash(self, hash: u64) -> u64 {
        if self == Self::SHIPPED {
            return hash;
        }
        let mut sized = hash.to_le_bytes().to_vec();
        sized.extend_from_slice(b"max-pods");
        sized.extend_from_slice(&u64::from(self.0).to_le_bytes());
        object_hash(&sized)
    }
}

impl Default for PodCapacity {
    fn default() -> Self {
        Self::SHIPPED
    }
}

/// As `--max-pods` takes it: the number of pods.
impl std::fmt::Display for PodCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// For clap: a `--max-pods` value.
pub fn parse_max_pods(value: &str) -> Result<PodCapacity, String> {
    let pods = value
        .parse::<u32>()
        .map_err(|_| format!("not a number of pods (1 to {MOST_PODS})"))?;
    PodCapacity::new(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_size_is_the_built_object_and_others_scale_the_per_pod_maps() {
        let shipped: Vec<_> = PodCapacity::SHIPPED.map_capacities().collect();
        assert_eq!(shipped, PER_POD_MAPS);
        assert_eq!(PodCapacity::SHIPPED.object_hash(42), 42);
        let ten_thousand = PodCapacity::new(10_000).unwrap();
        let sized: std::collections::HashMap<_, _> = ten_thousand.map_capacities().collect();
        assert_eq!(sized[names::POD_CONFIG], 10_000);
        assert_eq!(sized[names::LISTENERS], 40_000);
        assert_eq!(sized[names::PORT_SETS], 80_000);
        assert_ne!(ten_thousand.object_hash(42), 42);
        assert_ne!(
            ten_thousand.object_hash(42),
            PodCapacity(10_001).object_hash(42)
        );
    }

    #[test]
    fn no_pods_and_absurd_sizes_are_refused() {
        assert!(parse_max_pods("0").unwrap_err().contains("at least 1"));
        assert!(parse_max_pods("1000000").unwrap_err().contains("at most"));
        assert!(parse_max_pods("many").is_err());
        assert_eq!(parse_max_pods("10000").unwrap().pods(), 10_000);
    }
}
