//! The node lock: every writer under a pin root holds it.

use std::{fs, io, os::fd::AsRawFd, path::Path};

use super::pins::PinRoot;
use crate::fs_error::{fs_err, FsError};

/// Exclusive lock over everything under the pin root, held for the life of the value.
/// Concurrent init containers on one node serialise here.
pub struct NodeLock {
    _dir: DirLock,
}

impl NodeLock {
    pub fn acquire(root: &PinRoot) -> Result<Self, FsError> {
        fs::create_dir_all(root.objects_dir()).map_err(fs_err("creating", root.path()))?;
        Ok(NodeLock {
            _dir: DirLock::acquire(root.path())?,
        })
    }
}

/// An exclusive `flock` on a directory, held for the life of the value.
pub struct DirLock {
    _dir: fs::File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<Self, FsError> {
        let file = fs::File::open(dir).map_err(fs_err("opening", dir))?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(fs_err("locking", dir)(io::Error::last_os_error()));
        }
        Ok(DirLock { _dir: file })
    }
}
