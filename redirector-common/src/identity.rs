//! Identities that travel between the kernel and user space as bare integers in map keys,
//! given a type where user space handles them.

use core::fmt;

/// A network namespace's cookie (`SO_NETNS_COOKIE`, `bpf_get_netns_cookie`): the key of
/// everything a pod has in the node's maps. Unique for the life of the kernel, never reused.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetnsCookie(pub u64);

impl NetnsCookie {
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for NetnsCookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl core::str::FromStr for NetnsCookie {
    type Err = core::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(NetnsCookie)
    }
}
