//! The node lock: every writer under a pin root holds it.

use std::{fs, io, os::unix::fs::MetadataExt, path::Path};

use super::pins::PinRoot;
use crate::sys::fs_error::{fs_err, FsError};

/// Exclusive lock over everything under the pin root, held for the life of the value.
/// Concurrent init containers on one node serialise here.
///
/// The root itself goes when its last pod goes, so a waiter can be granted the lock on a
/// directory that was removed meanwhile while a newcomer locks the one that replaced it:
/// two writers at once. Removal happens only under the lock ([`NodeLock::remove_root_if_empty`]),
/// and a lock is kept only when the path still names the directory locked.
pub struct NodeLock {
    _dir: DirLock,
}

impl NodeLock {
    pub fn acquire(root: &PinRoot) -> Result<Self, FsError> {
        // The root can go between any two of these steps (the last pod's cleanup): then it
        // is made again and locked anew. Each retry follows another run's removal, so a
        // bound is only there to turn a path that never stays (not a race) into an error.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let retry = attempt < MOST_ATTEMPTS;
            // AlreadyExists too: create_dir_all met the root made by another run and then
            // found it gone (removed by a cleanup) when it checked it was a directory.
            match fs::create_dir_all(root.objects_dir()) {
                Err(err)
                    if retry
                        && matches!(
                            err.kind(),
                            io::ErrorKind::NotFound | io::ErrorKind::AlreadyExists
                        ) =>
                {
                    continue
                }
                made => made.map_err(fs_err("creating", root.path()))?,
            }
            let dir = match DirLock::acquire(root.path()) {
                Err(err) if retry && err.kind() == io::ErrorKind::NotFound => continue,
                locked => locked?,
            };
            if dir.still_at(root.path())? {
                return Ok(NodeLock { _dir: dir });
            }
            if !retry {
                return Err(fs_err("locking", root.path())(io::Error::other(
                    "the directory was replaced while locking it, again and again",
                )));
            }
        }
    }

    /// Removes the root when nothing is left in it; another pod's pins keep it in place.
    /// Under the lock, so that a waiter finds the root gone and makes a new one.
    pub fn remove_root_if_empty(self, root: &PinRoot) {
        for dir in [root.objects_dir(), root.path().to_path_buf()] {
            if let Err(err) = fs::remove_dir(&dir) {
                tracing::debug!("keeping {}: {err}", dir.display());
                return;
            }
        }
    }
}

/// How many times [`NodeLock::acquire`] tries before it gives up.
const MOST_ATTEMPTS: u32 = 1000;

/// An exclusive lock on a directory (`flock`, which `File::lock` is on Linux), held for the
/// life of the value.
pub struct DirLock {
    dir: fs::File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<Self, FsError> {
        let file = fs::File::open(dir).map_err(fs_err("opening", dir))?;
        file.lock().map_err(fs_err("locking", dir))?;
        Ok(DirLock { dir: file })
    }

    /// Whether `path` still names the directory this lock holds (it was not removed, or
    /// removed and made again, while this lock waited).
    fn still_at(&self, path: &Path) -> Result<bool, FsError> {
        let held = self.dir.metadata().map_err(fs_err("reading", path))?;
        match fs::metadata(path) {
            Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(fs_err("reading", path)(err)),
        }
    }
}
