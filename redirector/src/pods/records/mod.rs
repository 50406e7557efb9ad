//! What the daemon knows that bpffs does not: each pod's name, namespace path and flags,
//! under the state directory (a tmpfs such as /run: gone with a reboot, like the pins).
//!
//! Records are kept in shard files of a few records each, not one file per pod: on a
//! tmpfs a file takes an inode, a dentry and a whole page, about 5 KiB, which a pod would
//! otherwise pay for a few hundred bytes of record. The shards grow in number with the
//! node ([`layout`]), so that an add or a removal rewrites a few records however many
//! pods the node holds. Writers rewrite a shard (write, then rename) holding a lock on the
//! directory, since the daemon and CNI plugins write records concurrently; readers see
//! one whole shard or the other, and read the layout again when a shard they looked for
//! is gone (split meanwhile). `<cookie>.json`, one pod's record as earlier releases wrote
//! it, is still read, and is removed when that pod's record is next written or removed.

mod layout;
mod shard;

use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use redirector_common::{NetnsCookie, FORMAT};
use serde::{Deserialize, Serialize};

use crate::{
    engine::pod_keys::PodKeys,
    mesh::{Dialect, PodFlags},
    store::DirLock,
    sys::fs_error::{fs_err, gone_ok, FsError},
};
use layout::{Layout, ShardId, SPLIT_ABOVE};
use shard::Shard;

pub const DEFAULT_STATE_DIR: &str = "/run/redirector";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub netns_cookie: u64,
    pub netns: PathBuf,
    pub name: Option<String>,
    /// The pod's flags, in `dialect`.
    pub args: Vec<String>,
    /// Earlier releases wrote none: istio's.
    #[serde(default, skip_serializing_if = "Dialect::is_istio")]
    pub dialect: Dialect,
    /// The container runtime's id of the pod sandbox, when the CNI plugin set it up
    /// (CNI DEL names the pod by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The CNI network (the configuration's `name`) whose plugin set the pod up: CNI GC
    /// of one network leaves another network's pods alone. Earlier releases wrote none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The release format the record was written in ([`redirector_common::FORMAT`]);
    /// records of releases before it have none and are format 1.
    #[serde(default = "format_one")]
    pub format: u32,
    /// The map keys the pod's applies may have written: saved with the keys an apply is
    /// about to write before it writes them, and with exactly the plan's once it has, so
    /// that removing or changing the pod looks them up rather than reading node-wide maps
    /// through ([`crate::engine::pod_keys`]). Earlier releases wrote none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<PodKeys>,
    /// The pod's own cgroup, where the node's cgroup programs are attached for this pod
    /// alone ([`crate::engine::pod_cgroup`]); `None`: it relies on the programs attached at
    /// the node cgroup. Earlier releases wrote none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
}

/// Replace the file at `path` with `bytes`: written to `.<name>` beside it, then renamed
/// over it, so a reader sees the old file or the new one, whole.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let staging = path.with_file_name(format!(".{name}"));
    fs::write(&staging, bytes).map_err(fs_err("writing", &staging))?;
    fs::rename(&staging, path).map_err(fs_err("replacing", path))
}

fn format_one() -> u32 {
    1
}

/// The CNI attachment a pod is set up for: the runtime's sandbox id, and the network.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CniAttachment {
    pub container_id: String,
    pub network: Option<String>,
}

impl PodRecord {
    pub fn cookie(&self) -> NetnsCookie {
        NetnsCookie(self.netns_cookie)
    }

    /// The pod's flags in their dialect.
    pub fn flags(&self) -> PodFlags {
        PodFlags {
            dialect: self.dialect,
            args: self.args.clone(),
        }
    }

    /// The CNI attachment the pod was set up for, if a CNI plugin set it up.
    pub fn cni_attachment(&self) -> Option<CniAttachment> {
        self.container_id.clone().map(|container_id| CniAttachment {
            container_id,
            network: self.network.clone(),
        })
    }

    /// Whether the namespace the pod was set up in is still there at its path.
    pub fn namespace_alive(&self) -> bool {
        crate::sys::netns::Netns::open(&self.netns).is_ok_and(|n| n.cookie() == self.cookie())
    }
}

/// How a request may name a pod besides its netns cookie.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Alias {
    Name(String),
    Container(String),
    Netns(PathBuf),
}

impl Alias {
    fn of(record: &PodRecord) -> impl Iterator<Item = Alias> {
        let name = record.name.clone().map(Alias::Name);
        name.into_iter()
            .chain(record.container_id.clone().map(Alias::Container))
            .chain(Some(Alias::Netns(record.netns.clone())))
    }
}

/// The records under one state directory.
///
/// Looking a pod up by name, container id or netns path reads one record when this
/// process has seen it (saved or listed it) before, and the whole directory otherwise:
/// the aliases it remembers are only hints, each checked against the record it points to,
/// because other processes (the CNI plugin) write records too.
#[derive(Clone, Debug)]
pub struct Records {
    dir: PathBuf,
    aliases: Arc<Mutex<Aliases>>,
}

/// The aliases this process has seen, both ways: forgetting a pod's takes its own
/// entries out, not a pass over every pod's.
#[derive(Debug, Default)]
struct Aliases {
    cookie: HashMap<Alias, NetnsCookie>,
    of: HashMap<NetnsCookie, Vec<Alias>>,
}

impl Aliases {
    fn forget(&mut self, cookie: NetnsCookie) {
        for alias in self.of.remove(&cookie).unwrap_or_default() {
            if self.cookie.get(&alias) == Some(&cookie) {
                self.cookie.remove(&alias);
            }
        }
    }

    fn remember(&mut self, record: &PodRecord) {
        let cookie = record.cookie();
        self.forget(cookie);
        let aliases: Vec<Alias> = Alias::of(record).collect();
        for alias in &aliases {
            if let Some(earlier) = self.cookie.insert(alias.clone(), cookie) {
                // The alias moved to this pod (a reused netns path): the other keeps the rest.
                if let Some(theirs) = self.of.get_mut(&earlier).filter(|_| earlier != cookie) {
                    theirs.retain(|a| a != alias);
                }
            }
        }
        self.of.insert(cookie, aliases);
    }

    /// The aliases of exactly `records` (every record there is, just read): pods removed
    /// by another process (the CNI plugin's DEL, a gc) are forgotten here too, so a
    /// long-lived daemon holds hints for the pods that exist, not for every pod it ever saw.
    fn remember_only(&mut self, records: &[PodRecord]) {
        let listed: std::collections::HashSet<NetnsCookie> =
            records.iter().map(PodRecord::cookie).collect();
        let gone: Vec<NetnsCookie> = (self.of.keys())
            .filter(|c| !listed.contains(c))
            .copied()
            .collect();
        for cookie in gone {
            self.forget(cookie);
        }
        for record in records {
            self.remember(record);
        }
        // The tables shrink back after a burst of pods: their capacity is not kept for the
        // most pods the node ever held at once.
        self.cookie.shrink_to(self.cookie.len() * 2);
        self.of.shrink_to(self.of.len() * 2);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.of.len()
    }
}

impl Records {
    pub fn new(state_dir: &Path) -> Self {
        Records {
            dir: state_dir.join("pods"),
            aliases: Arc::default(),
        }
    }

    /// Where the daemon notes its node cgroup (`--cgroup`), for the plugin: beside the
    /// records, on the same tmpfs, so it goes with them at a reboot.
    fn node_cgroup_file(&self) -> PathBuf {
        self.dir.with_file_name("node-cgroup")
    }

    /// The node cgroup the daemon last started with, if it noted one.
    pub fn node_cgroup(&self) -> Option<PathBuf> {
        let text = fs::read_to_string(self.node_cgroup_file()).ok()?;
        Some(PathBuf::from(text.trim_end_matches('\n'))).filter(|p| p.is_absolute())
    }

    /// Where the daemon notes that it found the node unservable (the reason, one line), for
    /// the plugin and `redirector status`; removed when a daemon finds it servable.
    fn unservable_file(&self) -> PathBuf {
        self.dir.with_file_name("unservable")
    }

    /// Why the daemon found the node unservable at its last start, if it did.
    pub fn unservable(&self) -> Option<String> {
        let text = fs::read_to_string(self.unservable_file()).ok()?;
        Some(text.trim_end().to_owned()).filter(|t| !t.is_empty())
    }

    /// Note why the node cannot be served.
    pub fn save_unservable(&self, why: &str) -> Result<(), FsError> {
        let path = self.unservable_file();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(fs_err("creating", dir))?;
        }
        replace_file(&path, format!("{why}\n").as_bytes())
    }

    /// The node can be served (again).
    pub fn forget_unservable(&self) -> Result<(), FsError> {
        let path = self.unservable_file();
        gone_ok(fs::remove_file(&path)).map_err(fs_err("removing", &path))
    }

    /// Forget the node cgroup (`--uninstall`).
    pub fn forget_node_cgroup(&self) -> Result<(), FsError> {
        let path = self.node_cgroup_file();
        gone_ok(fs::remove_file(&path)).map_err(fs_err("removing", &path))
    }

    /// Note the node cgroup.
    pub fn save_node_cgroup(&self, cgroup: &Path) -> Result<(), FsError> {
        let path = self.node_cgroup_file();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(fs_err("creating", dir))?;
        }
        replace_file(&path, format!("{}\n", cgroup.display()).as_bytes())
    }

    fn path_of(&self, shard: ShardId) -> PathBuf {
        self.dir.join(shard.file_name())
    }

    /// The shard that holds the record of `cookie`, read without the lock: when the file
    /// is gone, a split may have moved it since the layout was read, which is read again.
    fn shard_of(&self, cookie: NetnsCookie) -> Result<(PathBuf, Option<Shard>), FsError> {
        let mut layout = Layout::read(&self.dir)?;
        loop {
            let path = self.path_of(layout.shard_of(cookie.get()));
            let shard = Shard::read(&path)?;
            if shard.is_some() {
                return Ok((path, shard));
            }
            let now = Layout::read(&self.dir)?;
            if now == layout {
                return Ok((path, None));
            }
            layout = now;
        }
    }

    /// Where an earlier release kept this pod's record.
    fn legacy_path(&self, cookie: NetnsCookie) -> PathBuf {
        self.dir.join(format!("{cookie}.json"))
    }

    fn aliases(&self) -> MutexGuard<'_, Aliases> {
        self.aliases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, record: &PodRecord) {
        self.aliases().remember(record);
    }

    /// The record of the pod with this cookie, if there is one.
    pub fn get(&self, cookie: NetnsCookie) -> Result<Option<PodRecord>, FsError> {
        if let (path, Some(shard)) = self.shard_of(cookie)? {
            if let Some(record) = shard.get(cookie.get(), &path)? {
                return Ok(Some(record));
            }
        }
        match read_legacy(&self.legacy_path(cookie)) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            other => other.map(Some),
        }
    }

    /// The record known by the first of `aliases` that names one: the one a hint points
    /// to if that matches — the hint remembered, then `hint`, the caller's guess — else the
    /// first match among all records, which are read once for all the aliases.
    fn by_alias(
        &self,
        aliases: &[Alias],
        hint: Option<NetnsCookie>,
    ) -> Result<Option<PodRecord>, FsError> {
        for alias in aliases {
            let remembered = self.aliases().cookie.get(alias).copied();
            for cookie in remembered.into_iter().chain(hint) {
                if let Some(record) = self.get(cookie)? {
                    if Alias::of(&record).any(|a| a == *alias) {
                        return Ok(Some(record));
                    }
                }
            }
        }
        let all = self.all()?;
        Ok(aliases
            .iter()
            .find_map(|alias| all.iter().find(|r| Alias::of(r).any(|a| a == *alias)))
            .cloned())
    }

    /// Write a record, replacing any earlier one of the same pod.
    pub fn save(&self, record: &PodRecord) -> Result<(), FsError> {
        fs::create_dir_all(&self.dir).map_err(fs_err("creating", &self.dir))?;
        self.rewrite_shard(record.cookie(), Some(record))?;
        self.remember(record);
        Ok(())
    }

    pub fn remove(&self, cookie: NetnsCookie) -> Result<(), FsError> {
        self.aliases().forget(cookie);
        if !self.dir.exists() {
            return Ok(());
        }
        self.rewrite_shard(cookie, None)
    }

    /// Why the shard of the pod with `cookie` must not be rewritten: a record in it of a
    /// newer format than this release writes (a rollback met a newer release's records),
    /// whose fields a rewrite would drop.
    pub fn newer_format(&self, cookie: NetnsCookie) -> Result<Option<String>, FsError> {
        let (path, shard) = self.shard_of(cookie)?;
        Ok(shard.and_then(|s| s.newer_format()).map(|f| {
            format!(
                "{} holds records of format {f}, and this redirector writes format {FORMAT}: it will not rewrite them (a newer release wrote them; run that release)",
                path.display()
            )
        }))
    }

    /// Puts `record` in place of the pod's record in its shard, or takes the pod's record
    /// out (`None`), under the directory's lock; the pod's legacy file goes too. A shard
    /// left with more than [`SPLIT_ABOVE`] records splits the next one.
    fn rewrite_shard(
        &self,
        cookie: NetnsCookie,
        record: Option<&PodRecord>,
    ) -> Result<(), FsError> {
        let _lock = DirLock::acquire(&self.dir)?;
        let layout = Layout::read(&self.dir)?;
        let path = self.path_of(layout.shard_of(cookie.get()));
        let mut shard = Shard::read(&path)?.unwrap_or_default();
        if let Some(newest) = shard.newer_format() {
            return Err(fs_err("rewriting", &path)(io::Error::other(format!(
                "it holds records of format {newest}, and this redirector writes format {FORMAT}"
            ))));
        }
        let changed = match record {
            Some(record) => {
                let serialised = shard.put(record);
                serialised.map_err(|err| fs_err("writing", &path)(io::Error::other(err)))?;
                true
            }
            None => shard.take(cookie.get()),
        };
        if changed {
            shard.write(&path)?;
        }
        let legacy = self.legacy_path(cookie);
        gone_ok(fs::remove_file(&legacy)).map_err(fs_err("removing", &legacy))?;
        if shard.len() > SPLIT_ABOVE {
            self.split(layout)?;
        }
        Ok(())
    }

    /// Splits the layout's next shard in two (the caller holds the lock): the two new
    /// shards are written, then the layout, then the split shard is removed. Once a level
    /// is split through, shard files a killed split left behind are removed too.
    fn split(&self, layout: Layout) -> Result<(), FsError> {
        let split = layout.next_split();
        let from = self.path_of(split.from);
        let shard = Shard::read(&from)?.unwrap_or_default();
        let first = split.into[0];
        // An empty part's file is removed: one a killed split left must not come back.
        for (id, part) in split.into.iter().zip(shard.split(|c| first.has(c))) {
            part.write(&self.path_of(*id))?;
        }
        split.then.write(&self.dir)?;
        gone_ok(fs::remove_file(&from)).map_err(fs_err("removing", &from))?;
        if split.then.shards().is_power_of_two() {
            self.remove_left_over(split.then)?;
        }
        Ok(())
    }

    /// Removes the shard files `layout` does not hold (the caller holds the lock).
    fn remove_left_over(&self, layout: Layout) -> Result<(), FsError> {
        for name in self.file_names()? {
            if ShardId::of_file(&name).is_some_and(|id| !layout.holds(id)) {
                let path = self.dir.join(name);
                gone_ok(fs::remove_file(&path)).map_err(fs_err("removing", &path))?;
            }
        }
        Ok(())
    }

    /// The names of the record files in the directory (none when there is no directory).
    fn file_names(&self) -> Result<Vec<String>, FsError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(fs_err("listing", &self.dir)(err)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let name = entry.map_err(fs_err("listing", &self.dir))?.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".json") && !name.starts_with('.') {
                names.push(name.into_owned());
            }
        }
        Ok(names)
    }

    /// Every record, by netns cookie. A file that does not parse is an error naming it.
    /// Read without the lock: the shards the layout holds, all over again if a split
    /// changed the layout meanwhile.
    pub fn all(&self) -> Result<Vec<PodRecord>, FsError> {
        let mut records = loop {
            let layout = Layout::read(&self.dir)?;
            let (records, whole) = self.read_all(layout)?;
            if whole && Layout::read(&self.dir)? == layout {
                break records;
            }
        };
        records.sort_by_key(|r: &PodRecord| r.netns_cookie);
        self.aliases().remember_only(&records);
        Ok(records)
    }

    /// The records of the shards `layout` holds and the legacy files, and whether every
    /// shard listed was still there to read.
    fn read_all(&self, layout: Layout) -> Result<(Vec<PodRecord>, bool), FsError> {
        let mut records = Vec::new();
        let mut legacy = Vec::new();
        let mut whole = true;
        for name in self.file_names()? {
            let path = self.dir.join(&name);
            match ShardId::of_file(&name) {
                Some(id) if layout.holds(id) => match Shard::read(&path)? {
                    Some(shard) => records.extend(shard.records(&path)?),
                    None => whole = false,
                },
                // A shard a split left behind, or of a layout not written yet.
                Some(_) => {}
                None if name.starts_with("shard-") => {}
                None => match read_legacy(&path) {
                    Ok(record) => legacy.push(record),
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(err) => return Err(err),
                },
            }
        }
        // A legacy file beside its pod's sharded record is older: writes remove it after.
        legacy.retain(|l| !records.iter().any(|r| r.netns_cookie == l.netns_cookie));
        records.extend(legacy);
        Ok((records, whole))
    }

    /// The record of the pod set up for container (sandbox) `id`; `netns_cookie`, the
    /// cookie of its namespace when the caller knows it, is looked at first.
    pub fn by_container(
        &self,
        id: &str,
        netns_cookie: Option<NetnsCookie>,
    ) -> Result<Option<PodRecord>, FsError> {
        self.by_alias(&[Alias::Container(id.to_owned())], netns_cookie)
    }

    /// The record of the pod named `name`, else the one in the namespace at `netns`.
    pub fn find(
        &self,
        name: Option<&str>,
        netns: Option<&Path>,
    ) -> Result<Option<PodRecord>, FsError> {
        let aliases: Vec<Alias> = (name.map(|n| Alias::Name(n.to_owned())).into_iter())
            .chain(netns.map(|p| Alias::Netns(p.to_path_buf())))
            .collect();
        self.by_alias(&aliases, None)
    }
}

/// A record file of an earlier release: one pod's record.
fn read_legacy(path: &Path) -> Result<PodRecord, FsError> {
    let text = fs::read(path).map_err(fs_err("reading", path))?;
    parse(path, &text)
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &[u8]) -> Result<T, FsError> {
    serde_json::from_slice(text).map_err(|err| fs_err("parsing", path)(io::Error::other(err)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state directory of its own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("records-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn record(cookie: u64, name: &str) -> PodRecord {
        PodRecord {
            netns_cookie: cookie,
            netns: PathBuf::from(format!("/run/netns/{name}")),
            name: Some(format!("default/{name}")),
            args: vec!["-p".into(), "15001".into()],
            dialect: Dialect::Istio,
            container_id: None,
            network: None,
            format: FORMAT,
            keys: None,
            cgroup: None,
        }
    }

    fn files(records: &Records) -> Vec<String> {
        crate::store::pins::names_in(&records.dir).unwrap()
    }

    #[test]
    fn pods_of_one_shard_share_its_file_and_keep_their_own_records() {
        let scratch = Scratch::new("shared");
        let records = Records::new(&scratch.0);
        let (a, b, c) = (
            record(5, "a"),
            record(5 + layout::BASE, "b"),
            record(6, "c"),
        );
        for r in [&a, &b, &c] {
            records.save(r).unwrap();
        }
        assert_eq!(files(&records), ["shard-05.json", "shard-06.json"]);
        assert_eq!(records.all().unwrap(), [a.clone(), c.clone(), b.clone()]);

        let renamed = PodRecord {
            name: Some("default/renamed".into()),
            ..a.clone()
        };
        records.save(&renamed).unwrap();
        records.remove(b.cookie()).unwrap();
        // Another process's view: nothing remembered, everything read from the files.
        let fresh = Records::new(&scratch.0);
        assert_eq!(fresh.get(a.cookie()).unwrap(), Some(renamed.clone()));
        assert_eq!(fresh.get(b.cookie()).unwrap(), None);
        assert_eq!(
            fresh.find(Some("default/c"), None).unwrap(),
            Some(c.clone())
        );
        assert_eq!(fresh.all().unwrap(), [renamed, c.clone()]);

        records.remove(a.cookie()).unwrap();
        records.remove(c.cookie()).unwrap();
        records.remove(c.cookie()).unwrap();
        assert!(files(&records).is_empty(), "{:?}", files(&records));
    }

    #[test]
    fn a_record_file_of_an_earlier_release_is_read_and_replaced_on_the_next_write() {
        let scratch = Scratch::new("legacy");
        let records = Records::new(&scratch.0);
        fs::create_dir_all(&records.dir).unwrap();
        let (old, other) = (record(7, "old"), record(8, "other"));
        for r in [&old, &other] {
            let json = serde_json::to_vec_pretty(r).unwrap();
            fs::write(records.dir.join(format!("{}.json", r.netns_cookie)), json).unwrap();
        }
        assert_eq!(records.all().unwrap(), [old.clone(), other.clone()]);
        assert_eq!(
            records.find(None, Some(&old.netns)).unwrap(),
            Some(old.clone())
        );

        let updated = PodRecord {
            args: vec!["-p".into(), "15002".into()],
            dialect: Dialect::Istio,
            ..old.clone()
        };
        records.save(&updated).unwrap();
        records.remove(other.cookie()).unwrap();
        assert_eq!(files(&records), ["shard-07.json"]);
        assert_eq!(Records::new(&scratch.0).all().unwrap(), [updated]);
    }

    #[test]
    fn writers_at_once_lose_no_record() {
        let scratch = Scratch::new("racing");
        // Separate values, as separate processes (the daemon, CNI plugins) have: nothing
        // shared but the files.
        std::thread::scope(|s| {
            for writer in 0..8u64 {
                let records = Records::new(&scratch.0);
                s.spawn(move || {
                    for i in 0..40 {
                        // Writers' cookies fall in the same shards.
                        records.save(&record(writer * 1000 + i, "p")).unwrap();
                    }
                });
            }
        });
        let all = Records::new(&scratch.0).all().unwrap();
        let cookies: Vec<u64> = all.iter().map(|r| r.netns_cookie).collect();
        let expected: Vec<u64> = (0..8)
            .flat_map(|w| (0..40).map(move |i| w * 1000 + i))
            .collect();
        assert_eq!(cookies, expected);
    }

    fn shard_sizes(records: &Records) -> Vec<usize> {
        let names = files(records);
        let shards = names.iter().filter(|n| ShardId::of_file(n).is_some());
        shards
            .map(|n| Shard::read(&records.dir.join(n)).unwrap().unwrap().len())
            .collect()
    }

    #[test]
    fn shards_grow_in_number_with_the_pods_and_stay_a_few_records() {
        let scratch = Scratch::new("growing");
        let records = Records::new(&scratch.0);
        let pods: Vec<PodRecord> = (0..3000).map(|i| record(40_000 + i, "p")).collect();
        for r in &pods {
            records.save(r).unwrap();
        }
        let sizes = shard_sizes(&records);
        assert!(sizes.len() >= 3000 / SPLIT_ABOVE, "{} shards", sizes.len());
        assert!(sizes.iter().all(|n| *n <= 2 * SPLIT_ABOVE), "{sizes:?}");
        let fresh = Records::new(&scratch.0);
        assert_eq!(fresh.all().unwrap(), pods);
        for r in pods.iter().step_by(7) {
            assert_eq!(fresh.get(r.cookie()).unwrap().as_ref(), Some(r));
        }
        for r in &pods {
            records.remove(r.cookie()).unwrap();
        }
        // The shards are gone; the layout stays, for the pods to come.
        assert_eq!(files(&records), [layout::LAYOUT_FILE]);
        assert!(Records::new(&scratch.0).all().unwrap().is_empty());
    }

    #[test]
    fn a_directory_of_the_fixed_64_shard_layout_is_read_and_split_as_it_is_written() {
        let scratch = Scratch::new("fixed");
        let records = Records::new(&scratch.0);
        fs::create_dir_all(&records.dir).unwrap();
        // As the fixed layout wrote them: `shard-NN.json`, a compact array by cookie,
        // about 30 records a shard, no layout file.
        let old: Vec<PodRecord> = (0..2000).map(|i| record(i, "old")).collect();
        for n in 0..layout::BASE {
            let shard: Vec<&PodRecord> = old.iter().filter(|r| r.netns_cookie % 64 == n).collect();
            let path = records.dir.join(format!("shard-{n:02}.json"));
            fs::write(path, serde_json::to_vec(&shard).unwrap()).unwrap();
        }
        assert_eq!(records.all().unwrap(), old);
        assert_eq!(records.get(NetnsCookie(1999)).unwrap().as_ref(), old.last());
        // Writes split the shards one at a time; every record stays found.
        let new: Vec<PodRecord> = (2000..2200).map(|i| record(i, "new")).collect();
        for r in &new {
            records.save(r).unwrap();
        }
        let fresh = Records::new(&scratch.0);
        assert!(Layout::read(&fresh.dir).unwrap().shards() > layout::BASE);
        for r in old.iter().chain(&new) {
            assert_eq!(fresh.get(r.cookie()).unwrap().as_ref(), Some(r));
        }
        assert_eq!(fresh.all().unwrap(), [old, new].concat());
    }

    #[test]
    fn a_split_killed_before_or_after_its_commit_loses_no_record() {
        let scratch = Scratch::new("killed");
        let records = Records::new(&scratch.0);
        let pods: Vec<PodRecord> = (0..300).map(|i| record(i, "p")).collect();
        for r in &pods {
            records.save(r).unwrap();
        }
        let layout = Layout::read(&records.dir).unwrap();
        let split = layout.next_split();
        let path = |id: ShardId| records.dir.join(id.file_name());
        // Killed before the commit: the two new shards written, one with a record the
        // shard split no longer has (removed after), the layout not.
        let gone = record(
            split.into[0].index() + 1_000 * split.into[0].modulus(),
            "gone",
        );
        let mut stale = Shard::read(&path(split.from)).unwrap().unwrap_or_default();
        stale.put(&gone).unwrap();
        let [a, _] = stale.split(|c| split.into[0].has(c));
        a.write(&path(split.into[0])).unwrap();
        assert_eq!(Records::new(&scratch.0).all().unwrap(), pods);
        assert_eq!(records.get(gone.cookie()).unwrap(), None);
        // The next split of that shard rewrites what it left.
        let more: Vec<PodRecord> = (300..400).map(|i| record(i, "p")).collect();
        for r in &more {
            records.save(r).unwrap();
        }
        let all = [pods.clone(), more.clone()].concat();
        assert_eq!(Records::new(&scratch.0).all().unwrap(), all);
        assert_eq!(records.get(gone.cookie()).unwrap(), None);

        // Killed after the commit: the split shard left beside the two it became.
        let layout = Layout::read(&records.dir).unwrap();
        let split = layout.next_split();
        let from = fs::read(path(split.from)).unwrap();
        records.split(layout).unwrap();
        fs::write(path(split.from), from).unwrap();
        let fresh = Records::new(&scratch.0);
        assert_eq!(fresh.all().unwrap(), all);
        for r in &all {
            assert_eq!(fresh.get(r.cookie()).unwrap().as_ref(), Some(r));
        }
        // Removed once the level is split through.
        for i in 400..2000 {
            records.save(&record(i, "p")).unwrap();
        }
        assert!(!path(split.from).exists());
    }

    #[test]
    fn readers_find_every_record_while_writers_split_shards() {
        let scratch = Scratch::new("splitting");
        let saved: Vec<std::sync::atomic::AtomicU64> = (0..4)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        std::thread::scope(|s| {
            for (writer, saved) in saved.iter().enumerate() {
                let records = Records::new(&scratch.0);
                s.spawn(move || {
                    for i in 0..400 {
                        records
                            .save(&record(writer as u64 * 10_000 + i, "p"))
                            .unwrap();
                        saved.store(i + 1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
            let saved = &saved;
            let scratch = &scratch;
            s.spawn(move || {
                let records = Records::new(&scratch.0);
                for round in 0..400u64 {
                    let writer = round % 4;
                    let done = saved[writer as usize].load(std::sync::atomic::Ordering::SeqCst);
                    if done > 0 {
                        let cookie = NetnsCookie(writer * 10_000 + round % done);
                        assert!(records.get(cookie).unwrap().is_some(), "{cookie}");
                    }
                    if round % 50 == 0 {
                        let all = records.all().unwrap();
                        assert!(all.len() as u64 >= done, "{} of {done}", all.len());
                    }
                }
            });
        });
        assert_eq!(Records::new(&scratch.0).all().unwrap().len(), 1600);
    }

    #[test]
    fn pods_another_process_removed_are_forgotten_at_the_next_listing() {
        let scratch = Scratch::new("forgotten");
        // The daemon lists; the plugin (another `Records`) adds and removes pods.
        let daemon = Records::new(&scratch.0);
        let plugin = Records::new(&scratch.0);
        let live = record(1, "live");
        plugin.save(&live).unwrap();
        for i in 0..5_000 {
            let pod = record(100 + i, &format!("churn{i}"));
            plugin.save(&pod).unwrap();
            if i % 50 == 0 {
                assert!(daemon.all().unwrap().len() >= 2);
            }
            plugin.remove(pod.cookie()).unwrap();
        }
        assert_eq!(daemon.all().unwrap(), vec![live.clone()]);
        assert_eq!(daemon.aliases().len(), 1, "aliases of pods that are gone");
        assert!(
            daemon.aliases().cookie.capacity() < 64,
            "tables kept at their peak"
        );
        // The one pod left is still found by its aliases.
        assert_eq!(daemon.find(Some("default/live"), None).unwrap(), Some(live));
    }

    #[test]
    fn a_shard_that_does_not_parse_is_an_error_naming_it() {
        let scratch = Scratch::new("broken");
        let records = Records::new(&scratch.0);
        fs::create_dir_all(&records.dir).unwrap();
        fs::write(records.dir.join("shard-03.json"), "{not json").unwrap();
        let err = records.all().unwrap_err().to_string();
        assert!(
            err.contains("parsing") && err.contains("shard-03.json"),
            "{err}"
        );
        let err = records.save(&record(3, "x")).unwrap_err().to_string();
        assert!(err.contains("shard-03.json"), "{err}");
    }
}
