//! Which shard file holds a pod's record: linear hashing over the netns cookie, so that
//! the shards grow in number with the node's pods, one split at a time, and each stays a
//! few records (one page of tmpfs) however many pods the node holds.
//!
//! `shards` ([`Layout`]) is the one number that says where every record is: with `m` the
//! largest `BASE × 2^k` not above it and `p = shards - m` the shards split so far at this
//! level, a cookie's shard is `cookie mod m`, or `cookie mod 2m` when that is below `p`.
//! A shard is named by its modulus and index; the `BASE` shards keep the names of the
//! fixed 64-shard layout before it (`shard-05.json`), so a state directory that layout
//! wrote is this one with no layout file and 64 shards.
//!
//! A split (of shard `p`) writes the two shards it becomes under new names, then the
//! layout file (the commit: write, then rename), then removes the split shard: a process
//! killed in between leaves files no layout names, which readers pass over and the next
//! split of the same shard rewrites.

use std::{fs, io, path::Path};

use serde::{Deserialize, Serialize};

use crate::sys::fs_error::{fs_err, FsError};

/// The shards of a state directory before its first split (and of the earlier layout).
pub const BASE: u64 = 64;

/// A write that leaves more records than this in a shard splits the next shard: at about
/// 400 bytes a record, a shard stays within a page.
pub const SPLIT_ABOVE: usize = 8;

/// The layout file; without `.json`, so that releases of the fixed layout, which read
/// every `*.json` there as a record, pass over it.
pub const LAYOUT_FILE: &str = "layout";

const SHARD_PREFIX: &str = "shard-";

/// How many shards there are, which says where each record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    shards: u64,
}

/// One shard: the records whose cookie is `index` modulo `modulus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardId {
    modulus: u64,
    index: u64,
}

/// A split: the shard split, the two it becomes, and the layout once it is done.
pub struct Split {
    pub from: ShardId,
    pub into: [ShardId; 2],
    pub then: Layout,
}

impl Layout {
    /// The layout of a directory with no layout file.
    pub const FIRST: Layout = Layout { shards: BASE };

    pub fn shards(self) -> u64 {
        self.shards
    }

    /// The modulus of the level being split, and how many of its shards are split.
    fn level(self) -> (u64, u64) {
        let mut m = BASE;
        while m * 2 <= self.shards {
            m *= 2;
        }
        (m, self.shards - m)
    }

    pub fn shard_of(self, cookie: u64) -> ShardId {
        let (m, split) = self.level();
        let index = cookie % m;
        if index < split {
            ShardId {
                modulus: 2 * m,
                index: cookie % (2 * m),
            }
        } else {
            ShardId { modulus: m, index }
        }
    }

    /// Whether this layout keeps records in `shard` (a file of another is left over).
    pub fn holds(self, shard: ShardId) -> bool {
        let (m, split) = self.level();
        let ShardId { modulus, index } = shard;
        (modulus == m && (split..m).contains(&index))
            || (modulus == 2 * m && (index < split || (m..m + split).contains(&index)))
    }

    pub fn next_split(self) -> Split {
        let (m, split) = self.level();
        let (modulus, index) = (2 * m, split);
        Split {
            from: ShardId { modulus: m, index },
            into: [
                ShardId { modulus, index },
                ShardId {
                    modulus,
                    index: index + m,
                },
            ],
            then: Layout {
                shards: self.shards + 1,
            },
        }
    }

    /// The layout of `dir`; [`Layout::FIRST`] without a layout file.
    pub fn read(dir: &Path) -> Result<Layout, FsError> {
        let path = dir.join(LAYOUT_FILE);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Layout::FIRST),
            Err(err) => return Err(fs_err("reading", &path)(err)),
        };
        let layout: Layout = serde_json::from_slice(&text)
            .map_err(|err| fs_err("parsing", &path)(io::Error::other(err)))?;
        if layout.shards < BASE {
            return Err(fs_err("parsing", &path)(io::Error::other(format!(
                "{} shards, fewer than the {BASE} a layout starts with",
                layout.shards
            ))));
        }
        Ok(layout)
    }

    /// Replaces the layout file (write, then rename): the commit of a split.
    pub fn write(self, dir: &Path) -> Result<(), FsError> {
        let path = dir.join(LAYOUT_FILE);
        let json =
            serde_json::to_vec(&self).map_err(|e| fs_err("writing", &path)(io::Error::other(e)))?;
        super::replace_file(&path, &json)
    }
}

impl ShardId {
    pub fn file_name(self) -> String {
        if self.modulus == BASE {
            format!("{SHARD_PREFIX}{:02}.json", self.index)
        } else {
            format!("{SHARD_PREFIX}{}-{}.json", self.modulus, self.index)
        }
    }

    /// The shard a file name names, if it names one.
    pub fn of_file(name: &str) -> Option<ShardId> {
        let stem = name.strip_prefix(SHARD_PREFIX)?.strip_suffix(".json")?;
        let (modulus, index) = match stem.split_once('-') {
            Some((modulus, index)) => (modulus.parse().ok()?, index.parse().ok()?),
            None => (BASE, stem.parse().ok()?),
        };
        let power_of_base = modulus >= BASE && (modulus / BASE).is_power_of_two();
        (power_of_base && modulus % BASE == 0 && index < modulus)
            .then_some(ShardId { modulus, index })
    }

    #[cfg(test)]
    pub fn index(self) -> u64 {
        self.index
    }

    #[cfg(test)]
    pub fn modulus(self) -> u64 {
        self.modulus
    }

    /// Whether the record of `cookie` belongs in this shard.
    pub fn has(self, cookie: u64) -> bool {
        cookie % self.modulus == self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shards: u64) -> Layout {
        Layout { shards }
    }

    #[test]
    fn every_cookie_has_one_shard_the_layout_holds() {
        for shards in [
            BASE,
            BASE + 1,
            BASE + 37,
            2 * BASE - 1,
            2 * BASE,
            5 * BASE + 3,
        ] {
            let l = layout(shards);
            let mut used = std::collections::BTreeSet::new();
            for cookie in 0..10 * shards {
                let shard = l.shard_of(cookie);
                assert!(l.holds(shard), "{shards}: {shard:?}");
                assert!(shard.has(cookie));
                used.insert(shard.file_name());
            }
            assert_eq!(used.len() as u64, shards, "{shards} shards in use");
        }
    }

    #[test]
    fn a_split_moves_only_the_records_of_the_shard_split() {
        let mut l = Layout::FIRST;
        for _ in 0..3 * BASE {
            let split = l.next_split();
            for cookie in 0..4096 {
                let (before, after) = (l.shard_of(cookie), split.then.shard_of(cookie));
                if before == split.from {
                    assert!(split.into.contains(&after), "{cookie}");
                } else {
                    assert_eq!(before, after, "{cookie}");
                }
            }
            assert!(!split.then.holds(split.from));
            l = split.then;
        }
    }

    #[test]
    fn the_first_shards_keep_the_fixed_layouts_names() {
        assert_eq!(
            Layout::FIRST.shard_of(5 + BASE).file_name(),
            "shard-05.json"
        );
        assert_eq!(layout(BASE + 1).shard_of(0).file_name(), "shard-128-0.json");
        assert_eq!(
            layout(BASE + 1).shard_of(BASE).file_name(),
            "shard-128-64.json"
        );
        for name in ["shard-05.json", "shard-128-64.json", "shard-256-3.json"] {
            assert_eq!(ShardId::of_file(name).unwrap().file_name(), name);
        }
        for name in [
            "shard-96-3.json",
            "shard-128-128.json",
            "shard-x.json",
            "7.json",
        ] {
            assert_eq!(ShardId::of_file(name), None, "{name}");
        }
    }
}
