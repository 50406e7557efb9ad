//! What the daemon knows that bpffs does not: each pod's name, namespace path and flags,
//! under the state directory (a tmpfs such as /run: gone with a reboot, like the pins).
//!
//! Records are kept in [`SHARDS`] files, a pod's in `shard-<cookie mod SHARDS>.json`, not
//! one file per pod: on a tmpfs a file takes an inode, a dentry and a whole page, about
//! 5 KiB, which a pod would otherwise pay for a few hundred bytes of record. Writers
//! rewrite a shard (write, then rename) holding a lock on the directory, since the daemon
//! and CNI plugins write records concurrently; readers see one whole shard or the other.
//! `<cookie>.json`, one pod's record as earlier releases wrote it, is still read, and is
//! removed when that pod's record is next written or removed.

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
    store::DirLock,
    sys::fs_error::{fs_err, gone_ok, FsError},
};

pub const DEFAULT_STATE_DIR: &str = "/run/redirector";

/// How many files the records are spread over: at 1,000 pods a shard holds about 16
/// records, a few KiB to rewrite per change.
pub const SHARDS: u64 = 64;
const SHARD_PREFIX: &str = "shard-";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub netns_cookie: u64,
    pub netns: PathBuf,
    pub name: Option<String>,
    pub args: Vec<String>,
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
}

fn format_one() -> u32 {
    1
}

/// The CNI attachment a pod is set up for: the runtime's sandbox id, and the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniAttachment {
    pub container_id: String,
    pub network: Option<String>,
}

impl PodRecord {
    pub fn cookie(&self) -> NetnsCookie {
        NetnsCookie(self.netns_cookie)
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
    aliases: Arc<Mutex<HashMap<Alias, NetnsCookie>>>,
}

impl Records {
    pub fn new(state_dir: &Path) -> Self {
        Records {
            dir: state_dir.join("pods"),
            aliases: Arc::default(),
        }
    }

    fn shard_path(&self, cookie: NetnsCookie) -> PathBuf {
        self.dir
            .join(format!("{SHARD_PREFIX}{:02}.json", cookie.get() % SHARDS))
    }

    /// Where an earlier release kept this pod's record.
    fn legacy_path(&self, cookie: NetnsCookie) -> PathBuf {
        self.dir.join(format!("{cookie}.json"))
    }

    fn aliases(&self) -> MutexGuard<'_, HashMap<Alias, NetnsCookie>> {
        self.aliases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, record: &PodRecord) {
        let mut aliases = self.aliases();
        for alias in Alias::of(record) {
            aliases.insert(alias, record.cookie());
        }
    }

    /// The record of the pod with this cookie, if there is one.
    pub fn get(&self, cookie: NetnsCookie) -> Result<Option<PodRecord>, FsError> {
        let shard = read_shard(&self.shard_path(cookie))?;
        if let Some(record) = shard.into_iter().find(|r| r.cookie() == cookie) {
            return Ok(Some(record));
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
            let remembered = self.aliases().get(alias).copied();
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
        self.aliases().retain(|_, c| *c != cookie);
        if !self.dir.exists() {
            return Ok(());
        }
        self.rewrite_shard(cookie, None)
    }

    /// Why the shard of the pod with `cookie` must not be rewritten: a record in it of a
    /// newer format than this release writes (a rollback met a newer release's records),
    /// whose fields a rewrite would drop.
    pub fn newer_format(&self, cookie: NetnsCookie) -> Result<Option<String>, FsError> {
        let path = self.shard_path(cookie);
        Ok(newer_format(&read_shard(&path)?).map(|f| {
            format!(
                "{} holds records of format {f}, and this redirector writes format {FORMAT}: it will not rewrite them (a newer release wrote them; run that release)",
                path.display()
            )
        }))
    }

    /// Puts `record` in place of the pod's record in its shard, or takes the pod's record
    /// out (`None`), under the directory's lock; the pod's legacy file goes too.
    fn rewrite_shard(
        &self,
        cookie: NetnsCookie,
        record: Option<&PodRecord>,
    ) -> Result<(), FsError> {
        let _lock = DirLock::acquire(&self.dir)?;
        let path = self.shard_path(cookie);
        let mut shard = read_shard(&path)?;
        if let Some(newest) = newer_format(&shard) {
            return Err(fs_err("rewriting", &path)(io::Error::other(format!(
                "it holds records of format {newest}, and this redirector writes format {FORMAT}"
            ))));
        }
        let before = shard.len();
        shard.retain(|r| r.cookie() != cookie);
        let changed = record.is_some() || shard.len() != before;
        if let Some(record) = record {
            let at = shard.partition_point(|r| r.netns_cookie < record.netns_cookie);
            shard.insert(at, record.clone());
        }
        if changed {
            write_shard(&self.dir, &path, &shard)?;
        }
        let legacy = self.legacy_path(cookie);
        gone_ok(fs::remove_file(&legacy)).map_err(fs_err("removing", &legacy))
    }

    /// Every record, by netns cookie. A file that does not parse is an error naming it.
    pub fn all(&self) -> Result<Vec<PodRecord>, FsError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(fs_err("listing", &self.dir)(err)),
        };
        let mut records = Vec::new();
        let mut legacy = Vec::new();
        for entry in entries {
            let path = entry.map_err(fs_err("listing", &self.dir))?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if !name.ends_with(".json") || name.starts_with('.') {
                continue;
            }
            if name.starts_with(SHARD_PREFIX) {
                records.extend(read_shard(&path)?);
            } else {
                legacy.push(read_legacy(&path)?);
            }
        }
        // A legacy file beside its pod's sharded record is older: writes remove it after.
        legacy.retain(|l| !records.iter().any(|r| r.netns_cookie == l.netns_cookie));
        records.extend(legacy);
        records.sort_by_key(|r: &PodRecord| r.netns_cookie);
        for record in &records {
            self.remember(record);
        }
        Ok(records)
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

/// The records of one shard, sorted by cookie; a missing shard has none. A shard that
/// does not parse is an error naming it.
fn read_shard(path: &Path) -> Result<Vec<PodRecord>, FsError> {
    match fs::read(path) {
        Ok(text) => parse(path, &text),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(fs_err("reading", path)(err)),
    }
}

/// The newest format of the records in `shard`, if newer than this release writes.
fn newer_format(shard: &[PodRecord]) -> Option<u32> {
    shard.iter().map(|r| r.format).max().filter(|f| *f > FORMAT)
}

/// Replaces a shard (write, then rename); an empty shard is removed.
fn write_shard(dir: &Path, path: &Path, shard: &[PodRecord]) -> Result<(), FsError> {
    if shard.is_empty() {
        return gone_ok(fs::remove_file(path)).map_err(fs_err("removing", path));
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let staging = dir.join(format!(".{name}"));
    let json = serde_json::to_vec(shard).map_err(io::Error::other);
    json.and_then(|json| fs::write(&staging, json))
        .map_err(fs_err("writing", &staging))?;
    fs::rename(&staging, path).map_err(fs_err("replacing", path))
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
            container_id: None,
            network: None,
            format: FORMAT,
            keys: None,
        }
    }

    fn files(records: &Records) -> Vec<String> {
        crate::store::pins::names_in(&records.dir).unwrap()
    }

    #[test]
    fn pods_of_one_shard_share_its_file_and_keep_their_own_records() {
        let scratch = Scratch::new("shared");
        let records = Records::new(&scratch.0);
        let (a, b, c) = (record(5, "a"), record(5 + SHARDS, "b"), record(6, "c"));
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
