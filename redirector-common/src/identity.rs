//! Identities that travel between the kernel and user space as bare integers in map keys,
//! given a type where user space handles them.

use core::fmt;

/// A network namespace's cookie (`SO_NETNS_COOKIE`, `bpf_get_netns_cookie`): the key of
/// everything a pod has in the node's maps. Unique for the life of the kernel, never reused.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct NetnsCookie(pub u64);

// A map key and value shared with the eBPF programs (bpfel), where it is a plain u64.
const _: () = assert!(size_of::<NetnsCookie>() == 8 && align_of::<NetnsCookie>() == 8);

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

/// The id of an eBPF object's bytes: FNV-1a over 64-bit little-endian words, then the
/// length (so that trailing zero bytes count). A content hash for telling objects apart,
/// not a cryptographic one. The build computes it for the embedded object, so that a run
/// never reads the whole object just to name it.
pub fn object_hash(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let words = bytes.chunks(8).map(|chunk| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        u64::from_le_bytes(word)
    });
    words
        .chain([bytes.len() as u64])
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, w| {
            (h ^ w).wrapping_mul(PRIME)
        })
}
