//! One shard file: a JSON array of records, each kept as the text it was read as. Reading
//! one pod's record parses that record alone, and a rewrite serialises only the record it
//! changes: the other records are copied as they are (a newer release's fields too).

use std::{fs, io, path::Path};

use redirector_common::FORMAT;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::PodRecord;
use crate::sys::fs_error::{fs_err, gone_ok, FsError};

/// A shard's records by cookie.
#[derive(Debug, Default)]
pub struct Shard {
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    cookie: u64,
    format: u32,
    json: Box<RawValue>,
}

/// What a record says of itself without being parsed whole.
#[derive(Deserialize)]
struct Head {
    netns_cookie: u64,
    #[serde(default = "super::format_one")]
    format: u32,
}

impl Shard {
    /// The shard at `path`; `None` when there is no such file. One that does not parse is
    /// an error naming it.
    pub fn read(path: &Path) -> Result<Option<Shard>, FsError> {
        let text = match fs::read(path) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(fs_err("reading", path)(err)),
        };
        let parsing = |err| fs_err("parsing", path)(io::Error::other(err));
        let raw: Vec<Box<RawValue>> = serde_json::from_slice(&text).map_err(parsing)?;
        let mut entries = raw
            .into_iter()
            .map(|json| {
                let head: Head = serde_json::from_str(json.get()).map_err(parsing)?;
                Ok(Entry {
                    cookie: head.netns_cookie,
                    format: head.format,
                    json,
                })
            })
            .collect::<Result<Vec<_>, FsError>>()?;
        entries.sort_by_key(|e| e.cookie);
        Ok(Some(Shard { entries }))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The record of `cookie`, parsed; `path` names the shard in an error.
    pub fn get(&self, cookie: u64, path: &Path) -> Result<Option<PodRecord>, FsError> {
        let Some(entry) = self.entries.iter().find(|e| e.cookie == cookie) else {
            return Ok(None);
        };
        serde_json::from_str(entry.json.get())
            .map(Some)
            .map_err(|err| fs_err("parsing", path)(io::Error::other(err)))
    }

    /// Every record, parsed.
    pub fn records(&self, path: &Path) -> Result<Vec<PodRecord>, FsError> {
        (self.entries.iter())
            .map(|e| serde_json::from_str(e.json.get()))
            .collect::<Result<_, _>>()
            .map_err(|err| fs_err("parsing", path)(io::Error::other(err)))
    }

    /// The newest format of the records here, if newer than this release writes.
    pub fn newer_format(&self) -> Option<u32> {
        self.entries
            .iter()
            .map(|e| e.format)
            .max()
            .filter(|f| *f > FORMAT)
    }

    /// Puts `record` in place of its pod's.
    pub fn put(&mut self, record: &PodRecord) -> Result<(), serde_json::Error> {
        let json = serde_json::value::to_raw_value(record)?;
        self.take(record.netns_cookie);
        let at = (self.entries).partition_point(|e| e.cookie < record.netns_cookie);
        let entry = Entry {
            cookie: record.netns_cookie,
            format: record.format,
            json,
        };
        self.entries.insert(at, entry);
        Ok(())
    }

    /// Takes the record of `cookie` out; whether there was one.
    pub fn take(&mut self, cookie: u64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.cookie != cookie);
        self.entries.len() != before
    }

    /// Splits the shard in two: the records `first` holds, and the others.
    pub fn split(self, first: impl Fn(u64) -> bool) -> [Shard; 2] {
        let (a, b) = self.entries.into_iter().partition(|e| first(e.cookie));
        [Shard { entries: a }, Shard { entries: b }]
    }

    /// Replaces the file at `path` (a staging file beside it, then a rename); an empty
    /// shard's file is removed.
    pub fn write(&self, path: &Path) -> Result<(), FsError> {
        if self.entries.is_empty() {
            return gone_ok(fs::remove_file(path)).map_err(fs_err("removing", path));
        }
        let size: usize = self.entries.iter().map(|e| e.json.get().len() + 1).sum();
        let mut text = Vec::with_capacity(size + 1);
        for (i, entry) in self.entries.iter().enumerate() {
            text.push(if i == 0 { b'[' } else { b',' });
            text.extend_from_slice(entry.json.get().as_bytes());
        }
        text.push(b']');
        super::replace_file(path, &text)
    }
}
