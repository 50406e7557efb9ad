//! What the daemon knows that bpffs does not: each pod's name, namespace path and flags,
//! one JSON file per pod under the state directory (a tmpfs such as /run: gone with a
//! reboot, like the pins).

use std::{
    fs, io,
    path::{Path, PathBuf},
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

/// The records under one state directory.
#[derive(Clone, Debug)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(state_dir: &Path) -> Self {
        Records {
            dir: state_dir.join("pods"),
        }
    }

    fn path(&self, cookie: NetnsCookie) -> PathBuf {
        self.dir.join(format!("{cookie}.json"))
    }

    /// Write a record, replacing any earlier one of the same pod (write, then rename).
    pub fn save(&self, record: &PodRecord) -> Result<(), FsError> {
        fs::create_dir_all(&self.dir).map_err(fs_err("creating", &self.dir))?;
        let path = self.path(record.cookie());
        let staging = self.dir.join(format!(".{}.json", record.netns_cookie));
        let json = serde_json::to_vec_pretty(record).map_err(io::Error::other);
        json.and_then(|json| fs::write(&staging, json))
            .map_err(fs_err("writing", &staging))?;
        fs::rename(&staging, &path).map_err(fs_err("replacing", &path))
    }

    pub fn remove(&self, cookie: NetnsCookie) -> Result<(), FsError> {
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
            let text = fs::read(&path).map_err(fs_err("reading", &path))?;
            let record = serde_json::from_slice(&text)
                .map_err(|err| fs_err("parsing", &path)(io::Error::other(err)))?;
            records.push(record);
        }
        records.sort_by_key(|r: &PodRecord| r.netns_cookie);
        Ok(records)
    }

    /// The record of the pod set up for container (sandbox) `id`.
    pub fn by_container(&self, id: &str) -> Result<Option<PodRecord>, FsError> {
        Ok(self
            .all()?
            .into_iter()
            .find(|r| r.container_id.as_deref() == Some(id)))
    }

    /// The record of the pod named `name`, or in the namespace at `netns`.
    pub fn find(
        &self,
        name: Option<&str>,
        netns: Option<&Path>,
    ) -> Result<Option<PodRecord>, FsError> {
        Ok(self.all()?.into_iter().find(|r| {
            name.is_some_and(|n| r.name.as_deref() == Some(n))
                || netns.is_some_and(|p| r.netns == p)
        }))
    }
}
