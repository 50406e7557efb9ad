//! The node lock: every writer under a pin root holds it.

use std::{fs, io, os::fd::AsRawFd};

use super::pins::PinRoot;
use crate::fs_error::{fs_err, FsError};

/// Exclusive lock over everything under the pin root, held for the life of the value.
/// Concurrent init containers on one node serialise here.
pub struct NodeLock {
    _dir: fs::File,
}

impl NodeLock {
    pub fn acquire(root: &PinRoot) -> Result<Self, FsError> {
        fs::create_dir_all(root.objects_dir()).map_err(fs_err("creating", root.path()))?;
        let dir = fs::File::open(root.path()).map_err(fs_err("opening", root.path()))?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(fs_err("locking", root.path())(io::Error::last_os_error()));
        }
        Ok(NodeLock { _dir: dir })
    }
}
