//! What the daemon knows that bpffs does not: each pod's name, namespace path and flags,
//! one JSON file per pod under the state directory (a tmpfs such as /run: gone with a
//! reboot, like the pins).

use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use redirector_common::NetnsCookie;
use serde::{Deserialize, Serialize};

use crate::fs_error::{fs_err, FsError};

pub const DEFAULT_STATE_DIR: &str = "/run/redirector";

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
}

impl PodRecord {
    pub fn cookie(&self) -> NetnsCookie {
        NetnsCookie(self.netns_cookie)
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

    fn path(&self, cookie: NetnsCookie) -> PathBuf {
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
    fn get(&self, cookie: NetnsCookie) -> Result<Option<PodRecord>, FsError> {
        match read(&self.path(cookie)) {
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

    /// Write a record, replacing any earlier one of the same pod (write, then rename).
    pub fn save(&self, record: &PodRecord) -> Result<(), FsError> {
        fs::create_dir_all(&self.dir).map_err(fs_err("creating", &self.dir))?;
        let path = self.path(record.cookie());
        let staging = self.dir.join(format!(".{}.json", record.netns_cookie));
        let json = serde_json::to_vec_pretty(record).map_err(io::Error::other);
        json.and_then(|json| fs::write(&staging, json))
            .map_err(fs_err("writing", &staging))?;
        fs::rename(&staging, &path).map_err(fs_err("replacing", &path))?;
        self.remember(record);
        Ok(())
    }

    pub fn remove(&self, cookie: NetnsCookie) -> Result<(), FsError> {
        self.aliases().retain(|_, c| *c != cookie);
        let path = self.path(cookie);
        match fs::remove_file(&path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                Err(fs_err("removing", &path)(err))
            }
            _ => Ok(()),
        }
    }

    /// Every record, by netns cookie. A file that does not parse is an error naming it.
    pub fn all(&self) -> Result<Vec<PodRecord>, FsError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(fs_err("listing", &self.dir)(err)),
        };
        let mut records = Vec::new();
        for entry in entries {
            let path = entry.map_err(fs_err("listing", &self.dir))?.path();
            let is_record = path.extension().is_some_and(|e| e == "json")
                && !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if !is_record {
                continue;
            }
            records.push(read(&path)?);
        }
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

/// One record file; a file that does not parse is an error naming it.
fn read(path: &Path) -> Result<PodRecord, FsError> {
    let text = fs::read(path).map_err(fs_err("reading", path))?;
    serde_json::from_slice(&text).map_err(|err| fs_err("parsing", path)(io::Error::other(err)))
}
